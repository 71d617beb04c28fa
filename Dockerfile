# celery-ha: one image for workers, beat, Flower and `celery-ha web`; the command picks the role.
#   docker build -t celery-ha .
#   docker run --rm -e CELERY_HA_REDIS_URL=redis://redis:6379/0 celery-ha              # a worker
#   docker run --rm ... celery-ha celery -A celery_ha beat --loglevel INFO             # beat

# ---- build: wheels for the project and every dependency (no compiler or cache in the final image).
# The image installs the project's wheel without extras, as a user's `pip install celery-ha` does:
# .ci/wheel_check runs that same install (a fresh venv, a worker, a demo) in CI.
FROM python:3.11-slim AS build
WORKDIR /src
COPY pyproject.toml README.md LICENSE ./
COPY celery_ha ./celery_ha
RUN pip wheel --no-cache-dir --wheel-dir /wheels .

# ---- run: installed at build time, a non-root user, tini as PID 1 forwarding signals to Celery
FROM python:3.11-slim
RUN apt-get update \
    && apt-get install -y --no-install-recommends tini \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --create-home --uid 10001 --shell /usr/sbin/nologin crawler
COPY --from=build /wheels /wheels
RUN pip install --no-cache-dir --no-index --find-links /wheels celery-ha && rm -rf /wheels
USER crawler
WORKDIR /home/crawler
ENV PYTHONUNBUFFERED=1 \
    CELERY_HA_DATA_DIR=/home/crawler/.celery-ha
# tini delivers docker stop's SIGTERM to Celery (the graceful shutdown of README "Operations") and
# reaps zombies; exec form everywhere, so no shell sits between them.
ENTRYPOINT ["tini", "--"]
CMD ["celery", "-A", "celery_ha", "worker", "--loglevel", "INFO"]
