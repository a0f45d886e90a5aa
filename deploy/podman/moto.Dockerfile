# moto's S3 server where motoserver/moto cannot be pulled (no registry): the same server
# and the same entry point as that image, installed on top of the triad CPU image, so its
# only new layer is moto itself, installed from the pip sources that image was built with.
#   podman build -f deploy/podman/moto.Dockerfile --build-arg BASE=localhost/triad:cpu \
#     -t localhost/triad-moto:5.2.5 .
#   TRIAD_S3_IMAGE=localhost/triad-moto:5.2.5 docker-compose -f deploy/compose/compose.s3.yaml up
# MOTO_VERSION is the pin of `moto[server]` in pyproject.toml's dev extra (a unit test keeps
# them and compose.s3.yaml's default image tag equal).
ARG BASE=triad:cpu
FROM ${BASE}
ARG MOTO_VERSION=5.2.5
ARG PIP_EXTRA_INDEX_URL
ARG PIP_FIND_LINKS
ARG PIP_CERT
RUN pip install "moto[server]==${MOTO_VERSION}" && moto_server --help >/dev/null
EXPOSE 5000
ENTRYPOINT ["moto_server", "-H", "0.0.0.0"]
