//! The decision RPCs' way past tonic's router.
//!
//! tonic routes among a server's services with axum's router (a path-pattern match, a
//! boxed service and a boxed future per request): about 2 000 instructions of a
//! `ShouldRateLimit` that costs about 52 000 in all (BENCHMARKS.md, "Instructions per
//! request"). [`ShortcutLayer`] sits inside the server's other layers (the RPC histogram,
//! the in-flight bound, the one-message body check) and sends requests for the two
//! decision services, Envoy's `RateLimitService` and the native `RateLimiter`, straight
//! to them by a prefix comparison; everything else (health, reflection, RLQS, the admin
//! pointer, unknown paths) goes on to the router as before.
//!
//! The answer is the router's to the byte: tonic mounts a service at `/<name>/{*rest}`,
//! and the shortcut takes exactly the paths that pattern takes (`/<name>/` and at least
//! one more byte); the generated service then answers an unknown method UNIMPLEMENTED as
//! it does behind the router.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use tonic::server::NamedService;

/// Wraps a server's router so that requests for `A` and `B` skip it.
#[derive(Clone)]
pub struct ShortcutLayer<A, B> {
    first: A,
    second: B,
}

impl<A, B> ShortcutLayer<A, B> {
    pub fn new(first: A, second: B) -> ShortcutLayer<A, B> {
        ShortcutLayer { first, second }
    }
}

impl<A: Clone, B: Clone, S> tower_layer::Layer<S> for ShortcutLayer<A, B> {
    type Service = Shortcut<A, B, S>;

    fn layer(&self, router: S) -> Shortcut<A, B, S> {
        Shortcut {
            first: self.first.clone(),
            second: self.second.clone(),
            router,
        }
    }
}

/// The service of [`ShortcutLayer`].
#[derive(Clone)]
pub struct Shortcut<A, B, S> {
    first: A,
    second: B,
    router: S,
}

/// Whether tonic's router would send `path` to the service called `name`: `/<name>/`
/// followed by at least one byte.
fn mounted(path: &str, name: &str) -> bool {
    path.strip_prefix('/')
        .and_then(|p| p.strip_prefix(name))
        .and_then(|p| p.strip_prefix('/'))
        .is_some_and(|rest| !rest.is_empty())
}

impl<A, B, S, Body> tower_service::Service<http::Request<Body>> for Shortcut<A, B, S>
where
    S: tower_service::Service<http::Request<Body>>,
    A: tower_service::Service<http::Request<Body>, Response = S::Response> + NamedService,
    B: tower_service::Service<http::Request<Body>, Response = S::Response> + NamedService,
    A::Error: Into<S::Error>,
    B::Error: Into<S::Error>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = ShortcutFuture<A::Future, B::Future, S::Future>;

    /// The router's readiness. tonic's generated services are always ready (their
    /// `poll_ready` answers at once), so the shortcut needs no readiness of its own.
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.router.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<Body>) -> Self::Future {
        let path = request.uri().path();
        if mounted(path, A::NAME) {
            ShortcutFuture::First {
                inner: self.first.call(request),
            }
        } else if mounted(path, B::NAME) {
            ShortcutFuture::Second {
                inner: self.second.call(request),
            }
        } else {
            ShortcutFuture::Router {
                inner: self.router.call(request),
            }
        }
    }
}

pin_project_lite::pin_project! {
    /// The future of [`Shortcut`]: whichever service took the request.
    #[project = ShortcutProj]
    pub enum ShortcutFuture<FA, FB, FS> {
        First { #[pin] inner: FA },
        Second { #[pin] inner: FB },
        Router { #[pin] inner: FS },
    }
}

impl<FA, FB, FS, R, EA, EB, E> Future for ShortcutFuture<FA, FB, FS>
where
    FA: Future<Output = Result<R, EA>>,
    FB: Future<Output = Result<R, EB>>,
    FS: Future<Output = Result<R, E>>,
    EA: Into<E>,
    EB: Into<E>,
{
    type Output = Result<R, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project() {
            ShortcutProj::First { inner } => inner.poll(cx).map_err(Into::into),
            ShortcutProj::Second { inner } => inner.poll(cx).map_err(Into::into),
            ShortcutProj::Router { inner } => inner.poll(cx),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::mounted;

    #[test]
    fn takes_exactly_the_paths_the_router_mounts() {
        let name = "envoy.service.ratelimit.v3.RateLimitService";
        assert!(mounted(
            "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit",
            name
        ));
        assert!(mounted(
            "/envoy.service.ratelimit.v3.RateLimitService/Nope",
            name
        ));
        // The router's pattern needs a method segment, a whole service name, a leading slash.
        assert!(!mounted(
            "/envoy.service.ratelimit.v3.RateLimitService/",
            name
        ));
        assert!(!mounted(
            "/envoy.service.ratelimit.v3.RateLimitService",
            name
        ));
        assert!(!mounted(
            "/envoy.service.ratelimit.v3.RateLimitServiceX/ShouldRateLimit",
            name
        ));
        assert!(!mounted(
            "envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit",
            name
        ));
        assert!(!mounted("/", name));
        assert!(!mounted("", name));
    }
}
