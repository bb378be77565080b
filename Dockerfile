# A worker image: sqla-queue and the examples package, entrypoint
# `sqla-queue worker`. Build context: the repository root.
# Not built here: the development machines have no Docker engine.
FROM python:3.11-slim

WORKDIR /app
# only what the package and the example need (keeps .venv and caches out)
COPY pyproject.toml README.md LICENSE ./
COPY sqla_queue ./sqla_queue
COPY examples ./examples
# the drivers are extras; docker-compose.yml runs this worker on PostgreSQL
RUN pip install --no-cache-dir '.[postgresql,mysql]'

# `sqla-queue worker module:Class` imports the module from the working
# directory, so examples.quickstart:Faturar is found here.
ENTRYPOINT ["sqla-queue", "worker"]
CMD ["examples.quickstart:Faturar"]
