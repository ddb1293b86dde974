# syntax=docker/dockerfile:1
#
# Container image for statestore-gateway: the gateway (`serve`) and the state
# store emulator (`emulator`). The `dev` subcommand (embedded broker) is left
# out: the build uses --no-default-features --features jemalloc, which drops
# `embedded-broker` and keeps the allocator.
#
#   docker build -t statestore-gateway:0.1.0 .
#
# Stages: chef (toolchain + cargo-chef) -> planner (dependency recipe) ->
# builder (dependencies cached in their own layer, then the crate) -> runtime
# (distroless, one binary, no shell).

ARG RUST_VERSION=1.94
ARG CARGO_CHEF_VERSION=0.1.77

FROM rust:${RUST_VERSION}-bookworm AS chef
ARG CARGO_CHEF_VERSION
RUN cargo install cargo-chef --locked --version "${CARGO_CHEF_VERSION}"
WORKDIR /src

# The recipe only changes when Cargo.toml or Cargo.lock change, so the
# dependency layer below is reused across source edits.
FROM chef AS planner
COPY . .
RUN cargo chef prepare --recipe-path recipe.json

FROM chef AS builder
COPY --from=planner /src/recipe.json recipe.json
# jemalloc's build settings live here ([env]); cook builds jemalloc with them.
COPY .cargo .cargo
RUN cargo chef cook --release --no-default-features --features jemalloc --recipe-path recipe.json
COPY . .
RUN cargo build --release --locked --no-default-features --features jemalloc --bin statestore-gateway \
    && install -D -m 0755 target/release/statestore-gateway /out/statestore-gateway

# cc-debian12 carries glibc and libgcc, which a Rust binary links against;
# TLS is rustls, so no OpenSSL is needed.
FROM gcr.io/distroless/cc-debian12:nonroot AS runtime
ARG VERSION=0.1.0
LABEL org.opencontainers.image.title="statestore-gateway" \
      org.opencontainers.image.description="HTTP and Server-Sent Events gateway (sidecar) to the Azure IoT Operations state store, with a state store emulator" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.licenses="MIT" \
      org.opencontainers.image.base.name="gcr.io/distroless/cc-debian12:nonroot"
COPY --from=builder /out/statestore-gateway /statestore-gateway
# 65532 is the distroless "nonroot" user; numeric so that Kubernetes'
# runAsNonRoot check can verify it without reading /etc/passwd.
USER 65532:65532
# 8080: HTTP key API (pod-local by default); 8081: admin (/livez, /readyz, /metrics).
EXPOSE 8080 8081
ENTRYPOINT ["/statestore-gateway"]
CMD ["serve"]
