//! Connections counted per client address, so that one client cannot take a listener's
//! whole connection bound: beyond [`ConnectionLimits::per_address_bound`] open connections
//! from one address (an IPv6 address by its /64, as the AUTH lockout counts), a new one is
//! closed as soon as it is accepted. Only addresses with open connections are tracked, so
//! the table never holds more entries than the listener has connections.
//!
//! Each address also has a count of its requests in flight, which its connections hand to
//! their requests ([`AddressSlot::in_flight`]), so that the in-flight bound can keep a
//! share per address (`in_flight.rs`) without a lookup per request.
//!
//! [`ConnectionLimits::per_address_bound`]: super::listener::ConnectionLimits::per_address_bound

use parking_lot::Mutex;
use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::AtomicUsize;
use std::sync::Arc;

use crate::resp::lockout::source_of;

/// Open connections by client address, for one listener, and each address's requests in
/// flight.
pub struct PerAddress {
    max: usize,
    open: Mutex<HashMap<IpAddr, (usize, InFlightCount)>>,
}

/// The requests in flight from one client address (over its connections to one listener).
pub type InFlightCount = Arc<AtomicUsize>;

/// One connection's place in its address's count; given back when dropped.
pub struct AddressSlot {
    table: Arc<PerAddress>,
    source: IpAddr,
    in_flight: InFlightCount,
}

impl PerAddress {
    /// A table allowing `max` (at least 1; `usize::MAX`: no bound) connections per address.
    pub fn new(max: usize) -> Arc<PerAddress> {
        Arc::new(PerAddress {
            max: max.max(1),
            open: Mutex::new(HashMap::new()),
        })
    }

    /// A place for one more connection from `peer`, unless its address has `max` open.
    pub fn take(self: &Arc<Self>, peer: IpAddr) -> Option<AddressSlot> {
        let source = source_of(peer);
        let mut open = self.open.lock();
        let (count, in_flight) = open.entry(source).or_default();
        if *count >= self.max {
            return None;
        }
        *count += 1;
        Some(AddressSlot {
            table: self.clone(),
            source,
            in_flight: in_flight.clone(),
        })
    }

    /// Addresses with open connections (tests).
    pub fn addresses(&self) -> usize {
        self.open.lock().len()
    }
}

impl AddressSlot {
    /// The count of requests in flight from this connection's address.
    pub fn in_flight(&self) -> &InFlightCount {
        &self.in_flight
    }
}

impl Drop for AddressSlot {
    fn drop(&mut self) {
        let mut open = self.table.open.lock();
        if let Some((count, _)) = open.get_mut(&self.source) {
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
        // One address's connections share one count of requests in flight.
        let other = table.take(b).unwrap();
        assert!(Arc::ptr_eq(_other.in_flight(), other.in_flight()));
        assert!(!Arc::ptr_eq(_other.in_flight(), _second.in_flight()));
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
