# kvroute: the router and the simulated engine in one small image.
#   docker build -t kvroute .        (docker compose up builds it too)
# The engine extra pulls torch; the CPU wheel index keeps the image free of CUDA libraries.
FROM python:3.11-slim

ARG TORCH_INDEX=https://download.pytorch.org/whl/cpu
ENV PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /app
COPY pyproject.toml constraints.txt README.md LICENSE ./
COPY schemas ./schemas
COPY publisher ./publisher
COPY offload_core ./offload_core
COPY router ./router
RUN pip install --extra-index-url "${TORCH_INDEX}" -c constraints.txt '.[engine]' \
    && useradd --system --uid 10001 kvroute
USER kvroute

# 8000: router REST API + dashboard; 8100: engine HTTP; 5557/5558: engine ZMQ PUB/replay.
EXPOSE 8000 8100 5557 5558
ENTRYPOINT ["kvroute"]
CMD ["serve", "--host", "0.0.0.0", "--port", "8000"]
