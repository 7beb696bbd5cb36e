# pidfence with a Java runtime (Spark's driver and executors) and the Kafka connector jars baked in.
#   docker build -t pidfence:local .        docker run --rm pidfence:local --help
FROM python:3.11-slim AS base
RUN apt-get update \
    && apt-get install -y --no-install-recommends default-jre-headless procps \
    && rm -rf /var/lib/apt/lists/*
ENV JAVA_HOME=/usr/lib/jvm/default-java \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIDFENCE_JAR_CACHE=/opt/pidfence/jars
WORKDIR /app
COPY pyproject.toml README.md ./
COPY src ./src
COPY infra ./infra
RUN pip install .

# Maven only in this stage: resolve the pinned jars once, copy the cache out.
FROM base AS jars
RUN apt-get update \
    && apt-get install -y --no-install-recommends maven \
    && rm -rf /var/lib/apt/lists/*
RUN python -c "from pidfence.services.jars import main; main()"

FROM base
COPY --from=jars /opt/pidfence/jars /opt/pidfence/jars
RUN useradd --create-home --uid 10001 pidfence \
    && mkdir -p /data && chown pidfence /data
USER pidfence
VOLUME ["/data"]
ENTRYPOINT ["pidfence"]
CMD ["--help"]
