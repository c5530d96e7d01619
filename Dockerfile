# Production image: the web (Daphne), worker and beat services of docker-compose.yml
# all run it, each with its own command.
FROM python:3.11-slim-bookworm

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
# The settings find templates/ and static/ next to the abpsite package (BASE_DIR), so
# the code runs from /app: PYTHONPATH puts /app ahead of the copy pip installs.
RUN pip install '.[postgres]' \
    && mkdir -p /app/var/media /app/var/static \
    && chown -R app:app /app/var
ENV PYTHONPATH=/app \
    DJANGO_MEDIA_ROOT=/app/var/media

USER app
EXPOSE 8000
# The web service (docker-compose.yml runs the same command): Django's system checks
# first, since Daphne runs none (production refuses to start while an account has the
# development password), then Daphne with the WebSocket frame limit from
# ABP_MAX_FRAME_BYTES (16 MiB unless set), as in the Procfile. A shell expands it.
CMD ["/bin/sh", "-c", "python manage.py check && exec daphne -b 0.0.0.0 -p 8000 --websocket-max-message-size ${ABP_MAX_FRAME_BYTES:-16777216} --websocket-max-frame-size ${ABP_MAX_FRAME_BYTES:-16777216} abpsite.asgi:application"]
