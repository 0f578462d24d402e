//! Liveness: peers not heard from for `net_timeout_ms` are dead, and
//! the network thread, which keeps peers told that we are alive
//! and polls when nobody else has for a tick.

use super::*;

impl State {
    pub(super) fn mark_dead(&mut self, nic: NicAddr, why: &str) {
        if let Some(p) = self.processes.get_mut(&nic) {
            if !p.dead {
                tracing::warn!(%nic, "peer process on another host is unreachable: {why}");
                p.dead = true;
            }
        }
        // What still waits to leave for it never will: with the transport's
        // queue to it full, it would hold up every packet behind it, to
        // every other process, for good.
        self.backlog.retain(|(to, _)| *to != nic);
        if self.write.as_ref().is_some_and(|w| w.nic == nic) {
            self.write = None;
        }
        if self.batch.as_ref().is_some_and(|b| b.nic == nic) {
            self.batch = None;
        }
    }

    /// Tells the processes we talk to that we live; finds those that went
    /// silent. `absent`: how long this process did not run (see
    /// [`absence`]); its peers' silence over that time is not held against
    /// them.
    pub(super) fn keep_alive(&mut self, nic: &Nic, absent: Duration, now: Instant) {
        let warned_lately = self
            .last_stall_warning
            .is_some_and(|t| now.duration_since(t) < STALL_WARNING_EVERY);
        if absent > ALIVE_EVERY && !warned_lately {
            self.last_stall_warning = Some(now);
            tracing::warn!(
                "this process did not run for {} ms (the machine or the process stalled): its peers' silence over that time is not counted",
                absent.as_millis()
            );
        }
        let mut silent = Vec::new();
        let mut due = Vec::new();
        for (&addr, p) in self.processes.iter_mut() {
            if p.dead {
                continue;
            }
            p.last_heard = credit_absence(p.last_heard, absent, now);
            if now.duration_since(p.last_heard) > nic.timeout {
                silent.push(addr);
            } else if now.duration_since(p.last_sent) >= ALIVE_EVERY {
                due.push(addr);
            }
        }
        for addr in silent {
            let heard = self.processes[&addr].last_heard.elapsed();
            self.mark_dead(
                addr,
                &format!("not heard from for {} ms", heard.as_millis()),
            );
        }
        for addr in due {
            self.send_owned(nic.name, addr, &Packet::Alive);
        }
    }
}

/// How long this process did not run, from the time since the interface's
/// thread last looked at its peers (every `ALIVE_EVERY / 2` when it runs):
/// what is beyond that period. A paused virtual machine, a stopped job or a
/// starved thread: the peers' silence then says nothing about them, and
/// they, stalled too, may have heard nothing from us either.
pub(super) fn absence(since_last_look: Duration) -> Duration {
    since_last_look.saturating_sub(ALIVE_EVERY / 2)
}

/// When a peer last heard from counts as heard, once `absent` of the time
/// up to `now` is credited to it: never later than now.
pub(super) fn credit_absence(last_heard: Instant, absent: Duration, now: Instant) -> Instant {
    last_heard.checked_add(absent).map_or(now, |t| t.min(now))
}

/// The network thread: polls when no endpoint has for a tick (the
/// application computes, or waits elsewhere), and keeps peers informed.
pub(super) fn run(nic: Weak<Nic>) {
    let mut last_alive = Instant::now();
    let mut tick = TICK;
    loop {
        std::thread::sleep(tick);
        let Some(nic) = nic.upgrade() else {
            return;
        };
        tick = if nic.talks_to_other_hosts() {
            TICK
        } else {
            IDLE_TICK
        };
        if nic.stop.load(Ordering::Acquire) || !nic.is_own() {
            return;
        }
        // Quiet once a whole tick passed without a mailbox message; one
        // that came in between says otherwise.
        let active = nic.active.swap(false, Ordering::Relaxed);
        nic.quiet.store(!active, Ordering::Relaxed);
        if !active && nic.active.load(Ordering::Relaxed) {
            nic.quiet.store(false, Ordering::Relaxed);
        }
        let idle = !nic.polled.swap(false, Ordering::Relaxed);
        if idle {
            nic.progress();
        } else if let Some(mut st) = nic.state.try_lock() {
            // A sender that stopped polling still sends what it gathered.
            st.flush_batch(&nic);
        }
        if last_alive.elapsed() >= ALIVE_EVERY / 2 {
            let mut st = nic.state.lock();
            let now = Instant::now();
            let absent = absence(now.duration_since(last_alive));
            last_alive = now;
            st.keep_alive(&nic, absent, now);
            st.flush_backlog();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_look_on_time_is_no_absence() {
        assert_eq!(absence(Duration::ZERO), Duration::ZERO);
        assert_eq!(absence(ALIVE_EVERY / 2), Duration::ZERO);
        assert_eq!(
            absence(ALIVE_EVERY / 2 + Duration::from_secs(30)),
            Duration::from_secs(30)
        );
    }

    #[test]
    fn an_absence_is_credited_to_a_peer_up_to_now() {
        let now = Instant::now();
        let heard = now.checked_sub(Duration::from_secs(5)).expect("uptime");
        let credited = credit_absence(heard, Duration::from_secs(4), now);
        assert_eq!(now.duration_since(credited), Duration::from_secs(1));
        // A peer heard just before the stall is as good as heard now.
        assert_eq!(credit_absence(heard, Duration::from_secs(60), now), now);
        assert_eq!(credit_absence(heard, Duration::ZERO, now), heard);
    }
}
