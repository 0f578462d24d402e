//! One execution (one hostile input, then a progress call of every
//! endpoint), and the invariants checked after it and at the end.

use super::*;

impl World {
    /// One hostile input, progress, and the checks.
    pub(crate) fn execute(&mut self) {
        let mut intercept = false;
        let choice = if self.polite {
            // Valid requests, or writes into H's memory.
            if self.rng.percent(60) {
                95
            } else {
                80
            }
        } else {
            self.rng.below(100)
        };
        match choice {
            0..=24 => {
                let mut message = self.pick_history().unwrap_or_else(|| self.random_message());
                if self.rng.percent(90) {
                    self.mutate(&mut message);
                }
                self.inject(message);
                self.stats.injected += 1;
            }
            25..=39 => {
                // An answer to one of the last messages of A (to B, mostly).
                let back = self.rng.below(6);
                let source = self.eps[0].tap.lock().sent.is_empty().then_some(());
                let last = match source {
                    Some(()) => None,
                    None => Some(self.eps[0].tap.lock().recent(back)),
                };
                let forged = last.and_then(|m| self.answer(&m));
                let mut message = forged.unwrap_or_else(|| self.random_message());
                if self.rng.percent(20) {
                    self.mutate(&mut message);
                }
                self.inject(message);
                self.stats.answers += 1;
            }
            40..=59 => {
                intercept = true;
                self.h.as_ref().unwrap().tap.lock().intercept = true;
            }
            60..=69 => {
                let message = self.random_message();
                self.inject(message);
                self.stats.random += 1;
            }
            70..=89 => self.shm_write(),
            _ => {
                let message = self.valid_request();
                self.inject(message);
                self.stats.requests += 1;
            }
        }
        // H first, so that a caught message reaches A in this execution.
        // H and B are not always scheduled: a forgery then finds the
        // transfers A just started before their real answers do.
        if intercept || self.rng.percent(70) {
            if let Some(h) = self.h.as_mut() {
                h.m.progress();
            }
        }
        let b_runs = self.rng.percent(60);
        if intercept {
            let caught = {
                let h = self.h.as_ref().unwrap();
                let mut state = h.tap.lock();
                state.intercept = false;
                state.intercepted.take()
            };
            let mut message = match caught {
                Some(m) => m,
                // Nothing left H: forge from the history instead.
                None => self.pick_history().unwrap_or_else(|| self.random_message()),
            };
            match self.rng.below(10) {
                // Dropped.
                0 => {}
                // Sent twice.
                1 => {
                    self.inject(message);
                    self.inject(message);
                }
                _ => {
                    self.mutate(&mut message);
                    self.inject(message);
                }
            }
            self.stats.intercepted += 1;
        }
        self.progress(0);
        if b_runs {
            self.progress(1);
        }
        self.drain_events();
        self.traffic(false);
        self.step += 1;
        self.check_memory();
        self.stats.execs += 1;
        CURRENT_EXEC.store(self.stats.execs, Ordering::Relaxed);
        if self.stats.execs.is_multiple_of(512) {
            self.check_hangs();
        }
    }

    /// One progress pass of A or B: in one pass of four the progress
    /// agent's (`set_helping`: what it matches, the sender copies), as
    /// when the application computes while its agent serves peers.
    fn progress(&mut self, at: usize) {
        let agent = self.rng.percent(25);
        let m = &mut self.eps[at].m;
        m.set_helping(agent);
        m.progress();
        m.set_helping(false);
    }

    /// One progress of everyone, events handled, traffic kept going.
    pub(crate) fn step_all(&mut self) {
        if let Some(h) = self.h.as_mut() {
            h.m.progress();
        }
        self.progress(0);
        self.progress(1);
        self.drain_events();
        self.traffic(false);
        self.step += 1;
    }

    // --- invariants ------------------------------------------------------------------

    /// Guards of every buffer of A and B, and the canaries.
    pub(crate) fn check_memory(&self) {
        for ep in &self.eps {
            let guards = ep.ops.values().all(|op| match &op.kind {
                OpKind::Send { mem, .. } => mem.as_ref().is_none_or(Mem::guards_intact),
                OpKind::Recv { mem, .. } => mem.guards_intact(),
                OpKind::HRecv { .. } => true,
                OpKind::Write { local, .. } | OpKind::Read { local, .. } => local.guards_intact(),
                OpKind::Atomic { result, .. } => result.as_ref().is_none_or(Mem::guards_intact),
            });
            let ranges = ep.ranges.iter().all(|r| r.mem.guards_intact())
                && ep.words.iter().all(|w| w.mem.guards_intact());
            let canaries = ep
                .canaries
                .iter()
                .all(|c| c.guards_intact() && c.bytes().iter().all(|&b| b == FILL));
            if !(guards && ranges && canaries) {
                self.fail(&format!(
                    "{:?}: a foreign write (guards: {guards}, ranges: {ranges}, canaries: {canaries})",
                    ep.who
                ));
            }
        }
        if !self.h_slots.iter().all(|(m, _)| m.guards_intact())
            || !self.h_range.guards_intact()
            || !self.h_heap.guards_intact()
        {
            self.fail("A: a write past the memory it granted H");
        }
    }

    fn check_hangs(&self) {
        for ep in &self.eps {
            for (context, op) in &ep.ops {
                if op.peer != Who::H && self.step - op.step > HANG_STEPS {
                    let what = format!(
                        "{:?}: operation {context} with {:?} hangs ({} steps, {:?}): {}; H polite: {}, fenced: {}\nA: {}\nB: {}",
                        ep.who,
                        op.peer,
                        self.step - op.step,
                        op.at.elapsed(),
                        op.kind.describe(),
                        self.polite,
                        self.h.is_some() && self.h_fenced(),
                        self.eps[0].m.debug_state(),
                        self.eps[1].m.debug_state()
                    );
                    self.fail(&what);
                }
            }
        }
    }

    /// The end: no new traffic; everything between A and B completes.
    pub(crate) fn finish(&mut self) {
        if self.h.is_some() {
            self.end_hostile();
        }
        let deadline = Instant::now() + FINISH_TIME;
        while self
            .eps
            .iter()
            .any(|e| !e.ops.is_empty() || !e.incoming.is_empty())
        {
            if Instant::now() > deadline {
                let open: Vec<usize> = self.eps.iter().map(|e| e.ops.len()).collect();
                self.fail(&format!("operations never completed at the end: {open:?}"));
            }
            self.progress(0);
            self.progress(1);
            self.drain_events();
            self.traffic(true);
            self.step += 1;
            self.check_memory();
        }
        for at in 0..2 {
            self.check_ranges(at);
            for (i, words) in self.eps[at].words.iter().enumerate() {
                for w in 0..WORDS {
                    let now =
                        u64::from_le_bytes(words.mem.bytes()[w * 8..w * 8 + 8].try_into().unwrap());
                    if now != words.values[w] {
                        self.fail(&format!(
                            "{:?}: word {w} of words {i} changed",
                            self.eps[at].who
                        ));
                    }
                }
            }
        }
    }
}
