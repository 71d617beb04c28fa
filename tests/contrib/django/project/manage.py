#!/usr/bin/env python
"""The test project's manage.py (run by the tests in child processes, never inside pytest)."""

import os
import sys

if __name__ == "__main__":
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "djproj.settings")
    from django.core.management import execute_from_command_line

    execute_from_command_line(sys.argv)
