//! Failed console logins, throttled per client address: after [`MAX_FAILURES`] wrong
//! passwords within [`WINDOW`], that address is answered 429 without its credentials being
//! looked at until the window ends, so `--basic-auth` cannot be guessed at line speed. An
//! IPv6 client counts by its /64 (one host holds a whole /64). The table keeps at most
//! [`MAX_ADDRESSES`]: past that the address whose window began first is forgotten, so a flood
//! of addresses neither grows the table nor locks anyone else out (a window shared by every
//! newcomer did: the attack on this change found an operator refused with the right password).
//! Behind a proxy every client has the proxy's address: one window for all of them.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv6Addr};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Wrong passwords allowed per address per window.
pub(super) const MAX_FAILURES: u32 = 10;

/// How long failures count, from an address's first.
pub(super) const WINDOW: Duration = Duration::from_secs(60);

/// Addresses kept at once.
const MAX_ADDRESSES: usize = 10_000;

/// Each address's window: when it began, and its failures in it.
#[derive(Default)]
pub(super) struct Logins {
    windows: Mutex<HashMap<IpAddr, (Instant, u32)>>,
}

impl Logins {
    /// How long `peer` must wait before it may try again, if it must.
    pub(super) fn wait(&self, peer: IpAddr, now: Instant) -> Option<Duration> {
        let windows = self.windows.lock().unwrap_or_else(|p| p.into_inner());
        let (start, failures) = windows.get(&Self::key(peer))?;
        let left = WINDOW.checked_sub(now.saturating_duration_since(*start))?;
        (*failures >= MAX_FAILURES && !left.is_zero()).then_some(left)
    }

    /// Counts a wrong password from `peer`.
    pub(super) fn failed(&self, peer: IpAddr, now: Instant) {
        let mut windows = self.windows.lock().unwrap_or_else(|p| p.into_inner());
        let key = Self::key(peer);
        if windows.len() >= MAX_ADDRESSES && !windows.contains_key(&key) {
            windows.retain(|_, (start, _)| now.saturating_duration_since(*start) < WINDOW);
            // (Still full: the oldest window goes. A scan of the table, only when it is full.)
            if windows.len() >= MAX_ADDRESSES {
                let oldest = windows.iter().min_by_key(|(_, (start, _))| *start);
                if let Some(oldest) = oldest.map(|(ip, _)| *ip) {
                    windows.remove(&oldest);
                }
            }
        }
        let window = windows.entry(key).or_insert((now, 0));
        if now.saturating_duration_since(window.0) >= WINDOW {
            *window = (now, 0);
        }
        window.1 = window.1.saturating_add(1);
    }

    /// Whom `peer` counts as: its address, an IPv6 one by its /64.
    fn key(peer: IpAddr) -> IpAddr {
        match peer.to_canonical() {
            IpAddr::V6(v6) => {
                let prefix = u128::from(v6) & !u128::from(u64::MAX);
                IpAddr::V6(Ipv6Addr::from(prefix))
            }
            v4 => v4,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Ten wrong passwords in a minute close the door for the rest of that minute, for that
    /// address only (an IPv6 client by its /64); then it may try again.
    #[test]
    fn an_address_is_throttled_after_ten_failures_for_the_rest_of_its_window() {
        let logins = Logins::default();
        let t0 = Instant::now();
        let a: IpAddr = "192.0.2.1".parse().unwrap();
        let b: IpAddr = "192.0.2.2".parse().unwrap();
        for i in 0..MAX_FAILURES {
            assert_eq!(logins.wait(a, t0), None, "after {i}");
            logins.failed(a, t0 + Duration::from_secs(u64::from(i)));
        }
        let left = logins.wait(a, t0 + Duration::from_secs(20)).unwrap();
        assert_eq!(left, Duration::from_secs(40));
        assert_eq!(logins.wait(b, t0), None);
        assert_eq!(logins.wait(a, t0 + WINDOW), None);
        // A new window counts from zero.
        logins.failed(a, t0 + WINDOW);
        assert_eq!(logins.wait(a, t0 + WINDOW), None);
        // One IPv6 host: its whole /64 counts as one.
        let v6 = |s: &str| s.parse::<IpAddr>().unwrap();
        for i in 0..MAX_FAILURES {
            logins.failed(v6(&format!("2001:db8::{i:x}")), t0);
        }
        assert!(logins.wait(v6("2001:db8::ffff"), t0).is_some());
        assert_eq!(logins.wait(v6("2001:db8:0:1::1"), t0), None);
    }

    /// A flood of addresses does not grow the table past its bound, and locks nobody else
    /// out: the oldest windows are forgotten to make room.
    #[test]
    fn a_flood_of_addresses_stays_bounded_and_locks_nobody_else_out() {
        let logins = Logins::default();
        let t0 = Instant::now();
        let operator = IpAddr::from([203, 0, 113, 7]);
        for i in 0..(MAX_ADDRESSES as u32 + 20) {
            for _ in 0..MAX_FAILURES {
                logins.failed(IpAddr::from(i.to_be_bytes()), t0);
            }
        }
        assert_eq!(logins.windows.lock().unwrap().len(), MAX_ADDRESSES);
        assert_eq!(logins.wait(operator, t0), None);
        // The flood's latest addresses are still held off.
        let latest = IpAddr::from((MAX_ADDRESSES as u32 + 19).to_be_bytes());
        assert!(logins.wait(latest, t0).is_some());
        // Once the windows end, the table empties as it fills.
        logins.failed(operator, t0 + WINDOW);
        assert_eq!(logins.wait(operator, t0 + WINDOW), None);
        assert!(logins.windows.lock().unwrap().len() < 10);
    }
}
