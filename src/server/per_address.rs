//! Connections counted per client address, so that one client cannot take a listener's
//! whole connection bound: beyond [`ConnectionLimits::per_address_bound`] open connections
//! from one address (an IPv6 address by its /64, as the AUTH lockout counts), a new one is
//! closed as soon as it is accepted. Only addresses with open connections are tracked, so
//! the table never holds more entries than the listener has connections.
//!
//! [`ConnectionLimits::per_address_bound`]: super::listener::ConnectionLimits::per_address_bound

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex, PoisonError};

use crate::resp::lockout::source_of;

/// Open connections by client address, for one listener.
pub struct PerAddress {
    max: usize,
    open: Mutex<HashMap<IpAddr, usize>>,
}

/// One connection's place in its address's count; given back when dropped.
pub struct AddressSlot {
    table: Arc<PerAddress>,
    source: IpAddr,
}

impl PerAddress {
    /// A table allowing `max` (at least 1) connections per address.
    pub fn new(max: usize) -> Arc<PerAddress> {
        Arc::new(PerAddress {
            max: max.max(1),
            open: Mutex::new(HashMap::new()),
        })
    }

    /// A place for one more connection from `peer`, unless its address has `max` open.
    pub fn take(self: &Arc<Self>, peer: IpAddr) -> Option<AddressSlot> {
        let source = source_of(peer);
        let mut open = self.open.lock().unwrap_or_else(PoisonError::into_inner);
        let count = open.entry(source).or_insert(0);
        if *count >= self.max {
            return None;
        }
        *count += 1;
        Some(AddressSlot {
            table: self.clone(),
            source,
        })
    }

    /// Addresses with open connections (tests).
    pub fn addresses(&self) -> usize {
        self.open
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }
}

impl Drop for AddressSlot {
    fn drop(&mut self) {
        let mut open = self
            .table
            .open
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(count) = open.get_mut(&self.source) {
            *count -= 1;
            if *count == 0 {
                open.remove(&self.source);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_address_gets_its_share_and_gives_it_back() {
        let table = PerAddress::new(2);
        let a: IpAddr = "10.0.0.1".parse().unwrap();
        let b: IpAddr = "10.0.0.2".parse().unwrap();
        let first = table.take(a).unwrap();
        let _second = table.take(a).unwrap();
        assert!(table.take(a).is_none(), "a third from one address");
        let _other = table.take(b).unwrap();
        drop(first);
        assert!(table.take(a).is_some(), "a place given back");
        // IPv6 by its /64: one host cannot spread over its own prefix.
        let v6 = |s: &str| s.parse::<IpAddr>().unwrap();
        let _x = table.take(v6("2001:db8::1")).unwrap();
        let _y = table.take(v6("2001:db8::ffff:2")).unwrap();
        assert!(table.take(v6("2001:db8::3")).is_none());
        assert!(table.take(v6("2001:db8:0:1::3")).is_some());
    }

    #[test]
    fn only_addresses_with_open_connections_are_kept() {
        let table = PerAddress::new(1);
        for i in 0..1_000u32 {
            let slot = table.take(IpAddr::from(i.to_be_bytes())).unwrap();
            drop(slot);
        }
        assert_eq!(table.addresses(), 0);
    }
}
