"""Settings of the test project. The tests pass the database and Redis through DJPROJ_* variables
(not CELERY_HA_*, which would win over the CELERY_HA dict this project is here to exercise)."""

import os

SECRET_KEY = "test-only-not-secret"
DEBUG = False
ALLOWED_HOSTS = ["*"]
USE_TZ = True
ROOT_URLCONF = "djproj.urls"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "celery_ha.contrib.django",
    "djproj.shop",
]
MIDDLEWARE = [
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
]
TEMPLATES = [{
    "BACKEND": "django.template.backends.django.DjangoTemplates",
    "APP_DIRS": True,
    "OPTIONS": {"context_processors": [
        "django.template.context_processors.request",
        "django.contrib.auth.context_processors.auth",
        "django.contrib.messages.context_processors.messages",
    ]},
}]
STATIC_URL = "/static/"

if os.environ.get("DJPROJ_DB_ENGINE") == "postgresql":
    DATABASES = {"default": {"ENGINE": "django.db.backends.postgresql", "NAME": os.environ["DJPROJ_DB_NAME"],
                             "HOST": "127.0.0.1", "PORT": "5432", "USER": "postgres"}}
else:
    DATABASES = {"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": os.environ["DJPROJ_DB_NAME"],
                             "OPTIONS": {"timeout": 20}}}

# Top-level names, as celery-ha read them before the app existed: below the dict (MAX_ATTEMPTS is 4).
CELERY_HA_LEASE_TTL = 45
CELERY_HA_MAX_ATTEMPTS = 9

CELERY_HA = {
    "REDIS_URL": os.environ.get("DJPROJ_REDIS_URL"),
    "NAMESPACE": os.environ.get("DJPROJ_NAMESPACE", "shop"),
    "MAX_ATTEMPTS": 4,
    "PUSH_TIMEOUT": float(os.environ.get("DJPROJ_PUSH_TIMEOUT", "0.5")),
    "RELAY_INTERVAL": float(os.environ.get("DJPROJ_RELAY_INTERVAL", "10")),
}
if os.environ.get("DJPROJ_EXTRA"):  # one more CELERY_HA key as JSON, for the configuration tests
    import json

    CELERY_HA.update(json.loads(os.environ["DJPROJ_EXTRA"]))

LOGGING = {
    "version": 1,
    "handlers": {"stderr": {"class": "logging.StreamHandler"}},
    "loggers": {"celery_ha": {"handlers": ["stderr"], "level": "INFO"}},
}

# Test speed: the default PBKDF2 costs a few hundred milliseconds per login.
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
