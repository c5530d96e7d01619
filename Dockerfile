# Production image: every service of docker-compose.yml runs it, each as
# `scripts/serve ROLE` (web, worker, small, beat, migrate).
FROM python:3.13-slim-bookworm

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

# What WeasyPrint loads at run time: Pango, HarfBuzz's subsetter, and a font.
RUN apt-get update \
    && apt-get install -y --no-install-recommends \
        libpango-1.0-0 libpangoft2-1.0-0 libharfbuzz-subset0 fonts-dejavu-core \
    && rm -rf /var/lib/apt/lists/*

RUN useradd --create-home --uid 10001 --user-group app

WORKDIR /app
COPY . .
# The image's lock (requirements/image.txt: the app with every extra, and the demo's own
# needs), exactly and with its hashes; then the app itself. abpsite, the demo project
# (with its pages in templates/ and static/), is not in the wheel, so the code runs
# from /app: PYTHONPATH puts /app ahead of the installed copy.
RUN pip install --require-hashes -r requirements/image.txt \
    && pip install --no-deps . \
    && mkdir -p /app/var/media /app/var/static \
    && chown -R app:app /app/var
ENV PYTHONPATH=/app \
    DJANGO_MEDIA_ROOT=/app/var/media

USER app
# Daphne listens on every interface of the container, on PORT.
ENV WEB_BIND=0.0.0.0 \
    PORT=8000
EXPOSE 8000
# The web service: scripts/serve runs Django's system checks first (Daphne runs none;
# production refuses to start with unsafe settings or the development password), then
# Daphne with the WebSocket frame limit from ABP_MAX_FRAME_BYTES. docker-compose.yml
# runs the same script for every service (`scripts/serve worker|small|beat|migrate`),
# and so do the Procfile and the end-to-end tests.
CMD ["scripts/serve", "web"]
