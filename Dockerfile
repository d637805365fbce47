# One image for the gateway (`metricvault serve`, `metricvault maintain --loop`) and the agent
# (`metricvault agent`), as deploy/kubernetes/ runs it:
#   docker build -t metricvault:0.1.0 .
# Stage 1 builds the wheel (and its dependencies' wheels) with the build tools; stage 2 installs
# only the wheels into a slim Python, runs as the unprivileged user 10001 (the gateway's
# runAsUser) and carries no compiler, no pip cache and no source tree.

ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
WORKDIR /src
RUN pip install --no-cache-dir --upgrade pip wheel
COPY pyproject.toml README.md ./
COPY src/ src/
# the kubernetes extra (grpcio): the agent names the pods that hold each GPU
RUN pip wheel --no-cache-dir --wheel-dir /wheels '.[kubernetes]'

FROM ${PYTHON_IMAGE} AS runtime
LABEL org.opencontainers.image.title="metricvault" \
      org.opencontainers.image.version="0.1.0" \
      org.opencontainers.image.licenses="Apache-2.0"
RUN groupadd --gid 10001 metricvault \
    && useradd --uid 10001 --gid 10001 --no-create-home --home-dir /var/lib/metricvault \
       --shell /usr/sbin/nologin metricvault \
    && mkdir -p /var/lib/metricvault /etc/metricvault \
    && chown 10001:10001 /var/lib/metricvault
COPY --from=build /wheels /wheels
RUN pip install --no-cache-dir --no-index --find-links=/wheels 'metricvault[kubernetes]' \
    && rm -rf /wheels
ENV PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1
WORKDIR /var/lib/metricvault
USER 10001:10001
EXPOSE 9201 9400
ENTRYPOINT ["metricvault"]
CMD ["serve", "--data", "/var/lib/metricvault/vault", "--listen", "0.0.0.0:9201", "--config", "/etc/metricvault/metricvault.toml"]
