# pidfence with a Java runtime (Spark's driver and executors) and the JVM jars fetched at build time.
#   docker build -t pidfence:local .        docker run --rm pidfence:local --help
FROM python:3.11-slim
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
# The sink extra (the image runs the sink too); `pidfence jars` fetches ZooKeeper, Kafka, Spark's
# Kafka connector and delta-spark from Maven Central into the image, so containers start offline.
RUN pip install '.[sink]' && pidfence jars
RUN useradd --create-home --uid 10001 pidfence \
    && mkdir -p /data && chown pidfence /data
USER pidfence
VOLUME ["/data"]
ENTRYPOINT ["pidfence"]
CMD ["--help"]
