"""``python -m celery_ha.cli``: the same as the ``celery-ha`` script (handy in tests and venvs)."""

from .app import main

main(prog_name="celery-ha")
