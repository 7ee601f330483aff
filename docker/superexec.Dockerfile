# The image of the processes that run fedx's ServerApp and ClientApps.
#
# Flower's images split a deployment into the SuperLink and SuperNodes
# (flwr/superlink, flwr/supernode: no app code) and SuperExec processes that
# run the apps (flwr/superexec + the app's dependencies). This image is the
# latter: Flower's SuperExec image with fedx and its dependencies installed.
# The tag must be the flwr version fedx is built for (pyproject.toml).
FROM flwr/superexec:1.41.0

# CPU wheels of torch by default (a much smaller image); the GPU variant
# (docker-compose.gpu.yml) builds with TORCH_INDEX_URL=https://pypi.org/simple,
# whose Linux torch wheels bundle CUDA.
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu

WORKDIR /app
COPY --chown=49999:49999 pyproject.toml README.md ./
COPY --chown=49999:49999 fedx ./fedx
# flwr comes with the base image: drop the pin so pip keeps that build.
RUN sed -i 's/.*"flwr\[simulation\].*//' pyproject.toml \
    && python -m pip install --no-cache-dir --extra-index-url "${TORCH_INDEX_URL}" . \
    && mkdir -p /app/outputs /app/data

ENTRYPOINT ["flower-superexec"]
