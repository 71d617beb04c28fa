"""The waiting head of a task record: the Python twin of wait_head and decode_wait of _record_codec.lua.

A finished record with a refetch schedule (state c or x with ``iv``) waits days for its next run, so its
size is what a scheduled crawl pays per URL (issue 30): its head is written in this form, ~25 bytes
where the compact head of ``records.py`` takes ~71 (13-digit decimal timestamps, a run of empty
fields). "@", the state letter (upper-case for a dedup task's), ``ut`` in base 62, then each present
field as a tag character and its value, in the order of WAIT_TAGS; a field takes the first of its forms
its value fits, and a state with a value no form holds keeps the compact (or JSON) head. Self-contained
(records.py imports it), so the few constants it shares with records.py are checked equal by
tests/state/test_compact_head.py.
"""

from __future__ import annotations

import re

#: The first byte of a waiting head (WAIT_MARK of _record_codec.lua); no other head starts with it.
WAIT_MARK = "@"
#: The tags, in the order a head holds them, their kinds and their fields (the three rows of WAIT_FORMS
#: of _record_codec.lua). The kinds:
#: i the integer, u ut minus it, c ct plus it (k, when shorter than ut minus it), s it x 1000 (iv in
#: whole seconds), x 16 lower-case hex digits as two 6-digit halves (a ctx.signature's), h the host the
#: payload names (no value), t the text, up to the next 0x1F (which ends it) or the head's end.
WAIT_TAGS = ",^*&:.(+=)?!|%_~/#$<>"
WAIT_KINDS = "uiiicuiiiiisixthttttt"
WAIT_FIELDS = ("ct", "p", "ma", "ms", "k", "k", "qt", "a", "st", "due", "f", "iv", "iv", "sg", "sg", "h",
               "h", "n", "w", "e", "pe")
_SEP = "\x1f"  # HEAD_SEP of records.py
_KNOWN = {"s", "dd", "ut", *WAIT_FIELDS}
_BY_TAG = {tag: (name, kind) for tag, name, kind in zip(WAIT_TAGS, WAIT_FIELDS, WAIT_KINDS, strict=True)}
_FORMS = {name: [(tag, kind) for tag, other, kind in zip(WAIT_TAGS, WAIT_FIELDS, WAIT_KINDS, strict=True)
                 if other == name] for name in dict.fromkeys(WAIT_FIELDS)}
_B62 = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"  # ALPHA of _base62.lua
_B62_VALUE = {c: i for i, c in enumerate(_B62)}
_B62_RUN = re.compile(r"[0-9A-Za-z]*")
_INT = re.compile(r"0|[1-9][0-9]{0,14}")  # an integer as fmt of _record_codec.lua writes it (exact in Lua)
_HEX16 = re.compile(r"[0-9a-f]{16}")


def _b62(x: int) -> str:
    out = ""
    while True:
        x, d = divmod(x, 62)
        out = _B62[d] + out
        if not x:
            return out


def _un62(digits: str) -> int:
    x = 0
    for c in digits:
        x = x * 62 + _B62_VALUE[c]
    return x


def _form(kind: str, v: str, utn: int, ctn: int | None, host: str | None) -> str | None:
    """``v`` in one form, or None when it does not fit (an integer kind's caller checked _INT)."""
    if kind == "t":
        return None if _SEP in v or "\n" in v else v
    if kind == "h":
        return "" if host is not None and v == host else None
    if kind == "x":
        return (_b62(int(v[:8], 16)).rjust(6, "0") + _b62(int(v[8:], 16)).rjust(6, "0")
                if _HEX16.fullmatch(v) else None)
    x = int(v)
    if kind == "i":
        return _b62(x)
    if kind == "u":
        return _b62(utn - x) if x <= utn else None
    if kind == "c":
        return _b62(x - ctn) if ctn is not None and x >= ctn and (x > utn or x - ctn < utn - x) else None
    return _b62(x // 1000) if x % 1000 == 0 else None  # s


def encode_wait(st: dict[str, str], host: str | None) -> str | None:
    """The waiting head of ``st`` (a state c or x; the task name left out at its default), or None
    when a value fits none of its field's forms. ``host``: the host the record's payload names (None
    for a JSON payload, or unknown: ``h`` is then written in full)."""
    if not st.keys() <= _KNOWN or not all(isinstance(v, str) and v for v in st.values()):
        return None
    letter, dd, ut = st["s"], st.get("dd"), st.get("ut", "")
    if dd is not None:
        if dd != "1":
            return None
        letter = letter.upper()
    if not _INT.fullmatch(ut):
        return None
    utn, ctn = int(ut), None
    out, open_text = [WAIT_MARK, letter, _b62(utn)], False
    for name, forms in _FORMS.items():
        v = st.get(name)
        if v is None:
            continue
        for tag, kind in forms:
            if kind in "iucs" and not _INT.fullmatch(v):
                return None
            enc = _form(kind, v, utn, ctn, host)
            if enc is not None:
                out += [_SEP, tag, enc] if open_text else [tag, enc]  # a text ends at the next _SEP
                open_text = kind == "t"
                break
        else:
            return None
        if name == "ct":
            ctn = int(v)
    return "".join(out)


def decode_wait(head: str, host: str | None) -> dict[str, str]:
    """The state a waiting head holds, as decode() of _record_codec.lua gives it (the task name left
    out at its default, a dedup task's lower-case letter and dd "1"); ``h`` of the host form is
    ``host`` (the payload's host, or records.py's HOST_MARK for a caller without the payload)."""
    letter = head[1:2]
    st = {"s": letter} if letter.islower() else {"s": letter.lower(), "dd": "1"}
    run = _B62_RUN.match(head, 2)
    assert run is not None  # the pattern matches an empty run too
    pos, utn, ctn = run.end(), _un62(run.group()), 0
    st["ut"] = str(utn)
    end = len(head)
    while pos < end:
        name, kind = _BY_TAG[head[pos]]
        if kind == "t":
            to = head.find(_SEP, pos + 1)
            to = end if to < 0 else to
            st[name], pos = head[pos + 1:to], to + 1
            continue
        if kind == "h":
            if host is not None:
                st[name] = host
            pos += 1
            continue
        run = _B62_RUN.match(head, pos + 1)
        assert run is not None
        digits, pos = run.group(), run.end()
        if kind == "x":
            st[name] = f"{_un62(digits[:6]):08x}{_un62(digits[6:]):08x}"
            continue
        x = _un62(digits)
        x = utn - x if kind == "u" else ctn + x if kind == "c" else x * 1000 if kind == "s" else x
        if name == "ct":
            ctn = x
        st[name] = str(x)
    return st
