//! The trace context of the request a task serves: a task-local, set by
//! [`scope`] and read by [`current`] and [`with_current`].

use std::future::Future;

use futures_util::future::Either;

use super::context::TraceContext;

tokio::task_local! {
    static CURRENT: TraceContext;
}

/// The trace context of the request this task is serving, if it has one.
pub fn current() -> Option<TraceContext> {
    CURRENT.try_with(TraceContext::clone).ok()
}

/// Calls `f` with the current trace context, without cloning it.
pub fn with_current<R>(f: impl FnOnce(&TraceContext) -> R) -> Option<R> {
    CURRENT.try_with(f).ok()
}

/// Runs `future` with `context` as its trace context (`None`: as it is).
pub fn scope<F: Future>(
    context: Option<TraceContext>,
    future: F,
) -> impl Future<Output = F::Output> {
    match context {
        Some(context) => Either::Left(CURRENT.scope(context, future)),
        None => Either::Right(future),
    }
}

/// `future` with the caller's trace context, for a task it spawns.
pub fn inherit<F: Future>(future: F) -> impl Future<Output = F::Output> {
    scope(current(), future)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn context() -> TraceContext {
        TraceContext::parse(
            b"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
            std::iter::empty(),
        )
        .unwrap()
    }

    #[tokio::test]
    async fn scope_sets_the_context_for_its_future_and_spawned_inheritors() {
        assert!(current().is_none());
        let seen = scope(Some(context()), async {
            let inner = tokio::spawn(inherit(async { current() }));
            (current(), inner.await.unwrap())
        })
        .await;
        assert_eq!(seen, (Some(context()), Some(context())));
        assert!(scope(None, async { current() }).await.is_none());
    }
}
