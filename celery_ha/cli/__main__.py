"""``python -m celery_ha.cli``: the same as the ``celery-ha`` script (handy in tests and venvs)."""

from celery_ha.cli.app import main

main(prog_name="celery-ha")
