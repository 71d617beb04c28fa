"""robots.txt rules matched as RFC 9309 §2.2 says (``fetch/robots_file.py``, through Protego): the
agent's own group (product token, case-insensitive, at a token boundary; groups of one agent merged,
the ``*`` groups too), the longest matching rule with Allow winning a tie, ``*`` and ``$`` wildcards,
``/robots.txt`` itself always allowed, Crawl-delay of the chosen group.

The standard library's parser, used before, took the first matching rule in file order, matched
``*`` and ``$`` literally (so ``Disallow: /*.pdf$`` forbade nothing), kept only the first ``*`` group
and the first group naming the agent, matched an agent as a substring and read no fractional
Crawl-delay. Each test here crawls a real site on a loopback address with the fetcher; the site's own
request log says what was fetched.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import pytest

from celery_ha.base.hosts import host_of_url
from celery_ha.fetch.fetcher import Fetcher, RobotsDisallowed
from celery_ha.state import TaskQueue
from tests.support.robots_site import RobotsSite

AGENT = "celery-ha-test"


@pytest.fixture
def site() -> Iterator[RobotsSite]:
    s = RobotsSite("127.0.0.21").start()
    yield s
    s.close()


def crawl(site: RobotsSite, paths: list[str], agent: str = "*") -> list[str]:
    """Fetch each path as a crawl does (obeying robots.txt as ``agent``); the paths it refused."""
    fetcher = Fetcher(None, robots_agent=agent, backoff_base=0.001)
    refused = []
    try:
        for path in paths:
            try:
                assert fetcher.fetch(site.url(path)).status_code == 200
            except RobotsDisallowed:
                refused.append(path)
    finally:
        fetcher.close()
    return refused


def fetched(site: RobotsSite) -> list[str]:
    """The pages the site served, in order (its log keeps paths without their query)."""
    return [a.path for a in site.pages()]


def test_wildcards_in_paths_forbid_what_they_match(site: RobotsSite) -> None:
    """``*`` matches any characters, a final ``$`` anchors the end (§2.2.3): a session id in any
    query and a PDF anywhere are forbidden; a PDF's URL with a query or a longer name is not."""
    site.robots = "User-agent: *\nDisallow: /*?sessionid=\nDisallow: /*.pdf$\n"
    paths = ["/cart?sessionid=42", "/list?page=2", "/docs/r.pdf", "/docs/s.pdf?v=2", "/docs/t.pdf.html"]
    assert crawl(site, paths) == ["/cart?sessionid=42", "/docs/r.pdf"]
    assert fetched(site) == ["/list", "/docs/s.pdf", "/docs/t.pdf.html"]


@pytest.mark.parametrize(("rules", "allowed", "forbidden"), [
    ("Disallow: /shop\nAllow: /shop/public\n", ["/shop/public/a"], ["/shop/cart", "/shopping"]),
    ("Allow: /shop/public\nDisallow: /shop\n", ["/shop/public/a"], ["/shop/cart", "/shopping"]),
    ("Allow: /shop\nDisallow: /shop/private\n", ["/shop/a"], ["/shop/private/a"]),
], ids=["disallow-first", "allow-first", "longer-disallow-last"])
def test_the_longest_matching_rule_wins_in_any_order(
        site: RobotsSite, rules: str, allowed: list[str], forbidden: list[str]) -> None:
    """§2.2.2: the most specific match (the most octets) decides, wherever it sits in the group."""
    site.robots = "User-agent: *\n" + rules
    assert crawl(site, forbidden + allowed) == forbidden
    assert fetched(site) == allowed


@pytest.mark.parametrize("rules", ["Disallow: /page\nAllow: /page\n", "Disallow: /x/a\nAllow: /x/*\n"],
                         ids=["same-path", "same-length-wildcard"])
def test_allow_wins_a_tie(site: RobotsSite, rules: str) -> None:
    """§2.2.2: of an Allow and a Disallow rule of equal length that both match, Allow is used."""
    site.robots = "User-agent: *\n" + rules
    path = "/page/1" if "/page" in rules else "/x/a/1"
    assert crawl(site, [path]) == []
    assert fetched(site) == [path]


@pytest.mark.parametrize("agent", [AGENT, f"Mozilla/5.0 (compatible; {AGENT.upper()}/1.0)"],
                         ids=["token", "user-agent-header"])
def test_the_agents_own_groups_merged_apply_instead_of_star(site: RobotsSite, agent: str) -> None:
    """§2.2.1: the groups naming the agent's product token (any case) are merged and obeyed, the
    ``*`` group is not; a group for ``test`` is another crawler's (not a token of ours), and a
    group for ``celery-ha-test`` found in a whole User-Agent header is ours."""
    site.robots = ("User-agent: *\nDisallow: /\n\n"
                   "User-agent: test\nAllow: /\n\n"
                   f"User-agent: {AGENT.title()}\nDisallow: /private\n\n"
                   "User-agent: other-bot\nDisallow: /\n\n"
                   f"User-agent: {AGENT}\nDisallow: /drafts\n")
    assert crawl(site, ["/private/a", "/public", "/drafts/a"], agent) == ["/private/a", "/drafts/a"]
    assert fetched(site) == ["/public"]


def test_the_star_groups_are_merged(site: RobotsSite) -> None:
    """A crawler with no group of its own (the fleet's default agent ``*``) obeys every ``*``
    group, not only the first."""
    site.robots = ("User-agent: *\nDisallow: /a\n\nUser-agent: other-bot\nDisallow: /\n\n"
                   "User-agent: *\nDisallow: /b\n")
    assert crawl(site, ["/a", "/b", "/c"]) == ["/a", "/b"]
    assert fetched(site) == ["/c"]


@pytest.mark.parametrize(("status", "refused"), [(200, False), (403, True)], ids=["rules", "403"])
def test_robots_txt_itself_is_allowed_unless_the_site_forbids_everything(
        site: RobotsSite, status: int, refused: bool) -> None:
    """§2.2.2: ``/robots.txt`` is implicitly allowed, even under ``Disallow: /``; a 401/403 for it
    still forbids every URL (this crawler's choice), robots.txt's own too."""
    site.robots, site.robots_status = "User-agent: *\nDisallow: /\n", status
    assert crawl(site, ["/robots.txt", "/page"]) == (["/robots.txt", "/page"] if refused else ["/page"])
    assert site.robots_count() == (1 if refused else 2) and fetched(site) == []


@pytest.fixture
def q(redis_url: str) -> Iterator[TaskQueue]:
    queue = TaskQueue.from_url(redis_url, host_gate=True)
    yield queue
    queue.client.close()


def test_crawl_delay_is_the_agents_groups(site: RobotsSite, q: TaskQueue) -> None:
    """The Crawl-delay of the agent's groups (merged: it sits in the second one; fractional) spaces
    the host, not the ``*`` group's 20 s: the gate keeps 0.5 s and the site saw its requests at
    least that far apart."""
    site.robots = (f"User-agent: *\nCrawl-delay: 20\n\nUser-agent: {AGENT}\nDisallow: /private\n\n"
                   f"User-agent: {AGENT}\nCrawl-delay: 0.5\n")
    fetcher = Fetcher(None, robots_agent=AGENT, backoff_base=0.001)
    try:
        for path in ("/a", "/b"):
            assert fetcher.fetch(site.url(path), gate=q.hosts).status_code == 200
    finally:
        fetcher.close()
    assert q.hosts.get(host_of_url(site.url())).crawl_delay == 0.5
    log = site.hits()
    assert [a.path for a in log] == ["/robots.txt", "/a", "/b"]
    gaps = [b.at - a.at for a, b in itertools.pairwise(log)]
    assert min(gaps) >= 0.5 - 0.01, gaps


@pytest.mark.parametrize("value", ["-1", "nan", "inf"])
def test_a_malformed_crawl_delay_is_ignored(site: RobotsSite, q: TaskQueue, value: str) -> None:
    """A negative, NaN or infinite Crawl-delay sets none (Protego 0.7 drops them; older releases
    returned them as they were): the page is fetched, the host keeps no Crawl-delay."""
    site.robots = f"User-agent: *\nCrawl-delay: {value}\nDisallow: /private\n"
    fetcher = Fetcher(None, backoff_base=0.001)
    try:
        assert fetcher.fetch(site.url("/a"), gate=q.hosts).status_code == 200
    finally:
        fetcher.close()
    assert q.hosts.get(host_of_url(site.url())).crawl_delay == 0.0
    assert fetched(site) == ["/a"]
