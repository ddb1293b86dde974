//! The open configuration subscriptions of one gateway process, by id (a
//! leaf: the operations hold it, the subscriptions close themselves in
//! it), so that an unsubscribe over either protocol ends the one it names.

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};

use tokio::sync::watch;

/// The open subscriptions of one gateway process, by id.
#[derive(Debug, Default)]
pub struct Subscriptions(Mutex<HashMap<String, watch::Sender<bool>>>);

impl Subscriptions {
    /// Opens one: its id, and what tells it to stop.
    pub(super) fn open(&self) -> (String, watch::Receiver<bool>) {
        let id = format!("{:032x}", rand::random::<u128>());
        let (stop, stopped) = watch::channel(false);
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(id.clone(), stop);
        (id, stopped)
    }

    /// Tells the subscription `id` to stop and forgets it; false when
    /// there is none.
    pub(super) fn close(&self, id: &str) -> bool {
        let stop = self
            .0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(id);
        stop.is_some_and(|stop| {
            stop.send_replace(true);
            true
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unsubscribe_ends_the_subscription_it_names_once() {
        let subscriptions = Subscriptions::default();
        let (id, stopped) = subscriptions.open();
        let (other, other_stopped) = subscriptions.open();
        assert_ne!(id, other);
        assert!(subscriptions.close(&id));
        assert!(*stopped.borrow());
        assert!(!*other_stopped.borrow());
        assert!(!subscriptions.close(&id));
        assert!(subscriptions.close(&other));
    }
}
