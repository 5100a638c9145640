# cellrate: a small image that serves the example limits by default.
#   docker build -t cellrate .
#   docker run --rm -p 8081:8081 -p 9090:9090 cellrate
# The Redis/Valkey module (crates/module, libcellrate_redis.so) is the second artefact, an
# image of its own (the `module` stage below; docs/redis-store.md, "The module"):
#   docker build --target module -t cellrate-redis-module .
# Mount your own limits directory over /etc/cellrate (a Kubernetes ConfigMap mounted as a
# directory reloads in place).
#
# The test command builds this file unchanged with podman and runs the image
# (scripts/image-check.sh), on local stand-ins for the two base images where no registry
# is reachable (scripts/stand-in-images.sh; docs/deploy.md says what that covers).

# --- build: dependencies first, in their own cached layer -------------------------------
FROM rust:1.95-slim-bookworm AS build
# The cargo profile: release-lto is the fully optimised build (BENCHMARKS.md, "Build
# profiles"); `--build-arg PROFILE=release` builds in a fraction of the time.
ARG PROFILE=release-lto
# libclang for the Redis module's bindings (redis-module runs bindgen on redismodule.h),
# a static busybox, the module image's one tool (it copies the module out), and for the
# profile llvm-profdata of rustc's own LLVM (Debian's llvm-NN, from the security suite,
# added where the sources lack it) and redis-benchmark: in a layer of their own, before
# any source, so that it is cached with the base image.
RUN . /etc/os-release \
    && llvm="llvm-$(rustc -vV | sed -n 's/^LLVM version: \([0-9]*\).*/\1/p')" \
    && if ! grep -rqs -- "$VERSION_CODENAME-security" /etc/apt/sources.list /etc/apt/sources.list.d; then \
         echo "deb http://deb.debian.org/debian-security $VERSION_CODENAME-security main" \
           > /etc/apt/sources.list.d/security.list; \
       fi \
    && apt-get update \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
       libclang-dev busybox-static $llvm redis-tools \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
# Only the manifests, the build script and the protos: this layer is rebuilt when
# dependencies change, not when the code does. No system protoc is needed (protox).
COPY Cargo.toml Cargo.lock ./
COPY proto ./proto
# The other crates of the workspace, by their manifests (cargo loads every member): the
# floors (crates/: alloc, core, observe, limits, store, service, whose build script compiles
# proto/), the Redis module (crates/module, whose dependencies are built here too) and the
# tests' harness (tests/support, never built here).
COPY crates/alloc/Cargo.toml ./crates/alloc/
COPY crates/core/Cargo.toml ./crates/core/
COPY crates/observe/Cargo.toml ./crates/observe/
COPY crates/limits/Cargo.toml ./crates/limits/
COPY crates/store/Cargo.toml ./crates/store/
COPY crates/service/Cargo.toml crates/service/build.rs ./crates/service/
COPY crates/module/Cargo.toml ./crates/module/
COPY tests/support/Cargo.toml ./tests/support/
# Every target Cargo.toml names must exist for cargo to load the manifest: stubs (a test
# keeps this list equal to the workspace's targets).
RUN mkdir -p src benches/grpc benches/resp crates/alloc/src crates/core/src crates/observe/src crates/limits/src \
       crates/store/src crates/service/src crates/module/src tests/support/src \
    && echo 'fn main() {}' > src/main.rs \
    && touch src/lib.rs crates/alloc/src/lib.rs crates/core/src/lib.rs crates/observe/src/lib.rs crates/limits/src/lib.rs \
       crates/store/src/lib.rs crates/service/src/lib.rs crates/module/src/lib.rs \
       tests/support/src/lib.rs \
       benches/decisions.rs benches/redis_throughput.rs benches/capacity.rs benches/new_paths.rs \
       benches/grpc/baseline.rs benches/grpc/loadgen.rs benches/grpc/attack.rs \
       benches/resp/floor.rs \
    && cargo build --profile "$PROFILE" --locked --bin cellrate \
    && cargo build --profile "$PROFILE" --locked -p cellrate-redis-module --lib \
    && rm -rf src benches crates/alloc/src crates/core/src crates/observe/src crates/limits/src crates/store/src \
       crates/service/src crates/module/src
COPY crates ./crates
COPY src ./src
COPY benches ./benches
COPY scripts/build-pgo.sh ./scripts/
# The library embeds the example limits (src/fuzzing.rs).
COPY config ./config
# PGO=1 (the default) lays the server out by a profile of its own load: built instrumented,
# driven on loopback inside this stage, rebuilt with the profile (scripts/build-pgo.sh;
# 12-22 % less CPU per ShouldRateLimit, BENCHMARKS.md "A profile-guided build"), at about
# twice the build time. `--build-arg PGO=0` builds without.
ARG PGO=1
RUN touch src/main.rs src/lib.rs crates/alloc/src/lib.rs crates/core/src/lib.rs crates/observe/src/lib.rs \
       crates/limits/src/lib.rs crates/store/src/lib.rs crates/service/src/lib.rs \
       crates/module/src/lib.rs \
    && if [ "$PGO" = 1 ]; then \
         PROFILE="$PROFILE" scripts/build-pgo.sh 3 && cp "target/pgo-use/$PROFILE/cellrate" cellrate; \
       else \
         cargo build --profile "$PROFILE" --locked --bin cellrate && cp "target/$PROFILE/cellrate" cellrate; \
       fi \
    && cargo build --profile "$PROFILE" --locked -p cellrate-redis-module --lib \
    && cp "target/$PROFILE/libcellrate_redis.so" libcellrate_redis.so \
    && mkdir modules

# --- module: the Redis/Valkey module, and a copier -------------------------------------
# `docker build --target module -t cellrate-redis-module .`: libcellrate_redis.so at
# /usr/lib/cellrate/ and nothing else but a static busybox, whose `cp` is the entrypoint:
# run with a volume at /modules, the image copies the module into it, for a Redis or Valkey
# container to `--loadmodule /modules/libcellrate_redis.so` (in Kubernetes, an initContainer
# into an emptyDir: examples/redis-module/). Build it with the same tag as the service image: the service
# and the module it detects are then one version. Its own image, not a file in the service
# image, because that one is distroless: no shell, no cp, nothing an initContainer could
# copy the file out with.
FROM scratch AS module
COPY --from=build /bin/busybox /busybox/busybox
COPY --from=build /src/libcellrate_redis.so /usr/lib/cellrate/libcellrate_redis.so
# The destination, owned by the image's user, so that a new named volume mounted there
# (which takes the image's ownership) is writable without root.
COPY --from=build --chown=65532:65532 /src/modules /modules
USER 65532:65532
ENTRYPOINT ["/busybox/busybox", "cp", "/usr/lib/cellrate/libcellrate_redis.so"]
CMD ["/modules/"]

# --- run: distroless with libc, no shell, non-root ------------------------------------
FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=build /src/cellrate /usr/local/bin/cellrate
# Where envoyproxy/ratelimit's image has its binary: run as `ratelimit`, cellrate reads
# its environment variables (Envoy Gateway's `command: [/bin/ratelimit]` works unchanged).
# A copy, not a link: distroless has no shell to make one, and a link's target would
# depend on whether the base image's /bin is itself a link.
COPY --from=build /src/cellrate /bin/ratelimit
COPY config /etc/cellrate
# The binary's defaults listen on 0.0.0.0:8081 (decisions) and 0.0.0.0:9090 (metrics);
# admin stays on 127.0.0.1:8082 unless CELLRATE_ADMIN_LISTEN says otherwise.
ENV CELLRATE_CONFIG=/etc/cellrate \
    CELLRATE_LOG_FORMAT=json
# Decisions (gRPC), admin (gRPC), metrics (HTTP).
EXPOSE 8081 8082 9090
# uid 65532 ("nonroot" in distroless).
USER 65532:65532
# No HEALTHCHECK: distroless has no shell or curl, and Kubernetes uses gRPC probes on
# grpc.health.v1 instead. Outside Kubernetes, probe http://HOST:9090/readyz.
ENTRYPOINT ["/usr/local/bin/cellrate"]
CMD ["serve"]
