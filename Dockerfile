# kvroute images, one Dockerfile, two targets:
#   docker build --target router -t kvroute-router .   the router: no torch (its install
#                                                       is the package without extras)
#   docker build --target engine -t kvroute-engine .   the simulated engine: torch (CPU
#                                                       wheel, no CUDA libraries)
# `docker compose up` builds both (docker-compose.yml names the target per service).
FROM python:3.11-slim AS base
ENV PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /app
# gcc + libxxhash-dev build the optional compiled core (router/native, setup.py); the
# install falls back to the pure-Python paths if they are missing.
RUN apt-get update -qq \
    && apt-get install -y -qq --no-install-recommends gcc libc6-dev libxxhash-dev \
    && rm -rf /var/lib/apt/lists/*
COPY pyproject.toml setup.py constraints.txt README.md LICENSE ./
COPY schemas ./schemas
COPY publisher ./publisher
COPY offload_core ./offload_core
COPY router ./router
RUN useradd --system --uid 10001 kvroute
ENTRYPOINT ["kvroute"]

# The engine: the `engine` extra pulls torch from the CPU wheel index.
FROM base AS engine
ARG TORCH_INDEX=https://download.pytorch.org/whl/cpu
RUN pip install --extra-index-url "${TORCH_INDEX}" -c constraints.txt '.[engine]'
USER kvroute
# 8100: engine HTTP; 5557/5558: ZMQ PUB/replay.
EXPOSE 8100 5557 5558
CMD ["engine", "--host", "0.0.0.0", "--port", "8100"]

# The router (last stage, so a plain `docker build .` gives it): no extras, no torch;
# the check fails the build if torch came in through some dependency anyway.
FROM base AS router
RUN pip install -c constraints.txt . \
    && python -c "import importlib.util as u, sys; sys.exit(u.find_spec('torch') is not None)"
USER kvroute
# 8000: OpenAI proxy, REST API, dashboard, /metrics.
EXPOSE 8000
# No API key: publish 8000 on 127.0.0.1 only (as docker-compose.yml does); set
# KVROUTE_API_KEY (or --api-key) before publishing it beyond the host.
CMD ["serve", "--host", "0.0.0.0", "--port", "8000", "--allow-insecure-remote"]
