//! The state's shared components, for the explorer: the CPUs, tasks, mms, EPT pages and oracle
//! (and the host's vCPUs, KVMs and threads) are each a [`HashCached`], shared copy-on-write
//! between states with its fingerprint digest. Visiting them is how their digests are forgotten
//! and how a stored state is interned (`Model::intern`): each component into the run's one copy
//! of it, and the performance state stowed against the run's blank. Model machinery, not a
//! kernel concept.

use crate::machine::Machine;
use shootdown_engine::{Components, HashCached, Interner};
use std::hash::Hash;

impl Machine {
    /// Every [`HashCached`] component of the state, to `v`.
    fn visit_components(&mut self, v: &mut impl Components) {
        fn each<T: Clone + Hash + Send + Sync + 'static>(
            v: &mut impl Components,
            list: &mut [HashCached<T>],
        ) {
            list.iter_mut()
                .enumerate()
                .for_each(|(i, c)| v.component(i, c));
        }
        each(v, &mut self.cpus);
        each(v, &mut self.tasks);
        each(v, &mut self.mms);
        each(v, &mut self.ept.pages);
        v.component(0, &mut self.oracle);
        if let Some(h) = &mut self.host {
            each(v, &mut h.vcpus);
            each(v, &mut h.kvms);
            each(v, &mut h.threads);
        }
    }

    /// Forget every remembered component digest ([`HashCached`]), so that the next
    /// fingerprint is computed from scratch (tests compare it with the remembered one).
    pub fn forget_digests(&mut self) {
        struct Forget;
        impl Components for Forget {
            fn component<T: Clone + Hash + Send + Sync + 'static>(
                &mut self,
                _: usize,
                c: &mut HashCached<T>,
            ) {
                c.forget();
            }
        }
        self.visit_components(&mut Forget);
    }

    /// Intern a stored state (`Model::intern`): each of its components into `interner`'s one
    /// copy of it, and its performance state stowed against the run's blank
    /// ([`Machine::blank_perf`]).
    pub(crate) fn intern_components(&mut self, interner: &Interner) {
        struct Intern<'a>(&'a Interner);
        impl Components for Intern<'_> {
            fn component<T: Clone + Hash + Send + Sync + 'static>(
                &mut self,
                index: usize,
                c: &mut HashCached<T>,
            ) {
                self.0.intern(index, c);
            }
        }
        self.visit_components(&mut Intern(interner));
        let blank = interner.constant(|| self.blank_perf());
        self.perf.stow(blank);
    }
}
