//! [`Interner`]: one copy of each distinct component value among the states the explorer
//! stores, as SPIN's collapse compression keeps one copy of each process's local state.
//!
//! Why: a successor copies the component its step changed (a CPU, a task, the oracle), and
//! two states of a level built from different parents often hold equal copies — CPU 1 stepped
//! from the same local state in states that differ only in CPU 2. Interning a stored state's
//! fresh components replaces each by the copy already stored, if there is one, so that many
//! frontier states cost their shells and little more (`pv_tlb_flush_3vcpu`'s peak memory
//! 169 → 128 MB, `docs/performance.md`).
//!
//! Components are looked up by their type, their place in the state (`index`: task 2 is
//! always task 2) and their [`HashCached`] digest, 128 bits, like states by their
//! fingerprints: two different values with one digest would be taken for one, at the same
//! odds as two states the visited set takes for one. The place matters because a digest
//! leaves out the fields fixed for a run (`hash_by_fields!`): two tasks at the same point
//! of different programs have one digest, and must not share a copy. So an interner serves
//! the states of one run (one scenario and memory model), where the component at one place
//! has the same fixed fields in every state. Interning never changes a value, a digest or a
//! fingerprint: only which equal copy a state points at.

use crate::digest::HashCached;
use std::any::{Any, TypeId};
use std::collections::HashMap;
use std::hash::Hash;
use std::sync::{Arc, Mutex};

/// A set of shared component copies, usable from every thread of a search.
pub struct Interner {
    /// Sharded by the digest's top bits, so that the explorer's threads rarely wait.
    shards: Vec<Mutex<HashMap<Key, Box<dyn Stored>>>>,
    /// One value per type for the whole run ([`Interner::constant`]).
    constants: Mutex<HashMap<TypeId, Arc<dyn Any + Send + Sync>>>,
}

/// A component's type, its place in the state and its digest.
type Key = (TypeId, usize, u128);

/// A stored copy: a `HashCached<T>` of some `T`.
trait Stored: Send + Sync {
    fn as_any(&self) -> &dyn Any;
    /// Whether only the interner still holds the value.
    fn unreferenced(&self) -> bool;
}

impl<T: Send + Sync + 'static> Stored for HashCached<T> {
    fn as_any(&self) -> &dyn Any {
        self
    }
    fn unreferenced(&self) -> bool {
        HashCached::handles(self) == 1
    }
}

const SHARDS: usize = 64;

impl Default for Interner {
    fn default() -> Self {
        Interner {
            shards: (0..SHARDS).map(|_| Mutex::default()).collect(),
            constants: Mutex::default(),
        }
    }
}

impl Interner {
    /// Point `c`, the component at place `index` of its list, at the stored copy of its
    /// value, storing it if it is the first. Only a component no other state shares (one its
    /// step copied) is looked up: a shared one was interned with the state it was copied
    /// from.
    pub fn intern<T: Clone + Hash + Send + Sync + 'static>(
        &self,
        index: usize,
        c: &mut HashCached<T>,
    ) {
        if HashCached::handles(c) > 1 {
            return;
        }
        let key = (TypeId::of::<T>(), index, c.digest());
        let mut shard = self.shards[(key.2 >> 122) as usize % SHARDS]
            .lock()
            .expect("an interner shard");
        match shard.get(&key) {
            Some(stored) => {
                *c = stored
                    .as_any()
                    .downcast_ref::<HashCached<T>>()
                    .expect("one type per TypeId")
                    .clone()
            }
            None => {
                shard.insert(key, Box::new(c.clone()));
            }
        }
    }

    /// The run's one value of type `T`, made by `make` on the first call: what every stored
    /// state may point at instead of a copy of its own — the model's blank performance state,
    /// say, which a stored state needs no copy of. `make` must give the same value whichever
    /// state first calls it, for the search not to depend on which thread gets there first.
    pub fn constant<T: Send + Sync + 'static>(&self, make: impl FnOnce() -> T) -> Arc<T> {
        let mut c = self.constants.lock().expect("the interner's constants");
        let v = c
            .entry(TypeId::of::<T>())
            .or_insert_with(|| Arc::new(make()) as Arc<dyn Any + Send + Sync>)
            .clone();
        v.downcast::<T>().expect("one type per TypeId")
    }

    /// Drop the copies no state holds any more (between levels of a search).
    pub fn purge(&self) {
        for s in &self.shards {
            s.lock()
                .expect("an interner shard")
                .retain(|_, v| !v.unreferenced());
        }
    }

    /// Distinct values stored.
    pub fn len(&self) -> usize {
        self.shards
            .iter()
            .map(|s| s.lock().expect("an interner shard").len())
            .sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn equal_components_end_up_sharing_one_copy() {
        let i = Interner::default();
        let mut a = HashCached::new(vec![1u32, 2]);
        let mut b = HashCached::new(vec![1u32, 2]);
        let mut c = HashCached::new(vec![3u32]);
        i.intern(0, &mut a);
        i.intern(0, &mut b);
        i.intern(0, &mut c);
        assert!(HashCached::ptr_eq(&a, &b), "equal values: one copy");
        assert!(!HashCached::ptr_eq(&a, &c));
        assert_eq!((&*a, &*b, &*c), (&vec![1, 2], &vec![1, 2], &vec![3]));
        assert_eq!(i.len(), 2);
        // A write to one takes a private copy; the other and the stored one keep the value.
        b.push(9);
        assert_eq!((&*a, &*b), (&vec![1, 2], &vec![1, 2, 9]));
        // Purging keeps what a state still holds, drops what none does.
        drop(c);
        i.purge();
        assert_eq!(i.len(), 1);
        let mut d = HashCached::new(vec![1u32, 2]);
        i.intern(0, &mut d);
        assert!(HashCached::ptr_eq(&a, &d));
    }

    #[test]
    fn values_of_different_types_are_not_confused() {
        let i = Interner::default();
        let mut a = HashCached::new(7u64);
        let mut b = HashCached::new(7u32);
        i.intern(0, &mut a);
        i.intern(0, &mut b);
        assert_eq!(i.len(), 2);
        assert_eq!((*a, *b), (7, 7));
    }

    #[test]
    fn a_constant_is_made_once() {
        let i = Interner::default();
        let a = i.constant(|| vec![1u8]);
        let b = i.constant(|| -> Vec<u8> { unreachable!("made twice") });
        assert!(Arc::ptr_eq(&a, &b));
        assert_eq!(*i.constant(|| 3u32), 3);
    }

    /// Equal values at different places stay apart: their digests may leave out fields
    /// that tell them apart (a task's program).
    #[test]
    fn equal_values_at_different_places_are_not_shared() {
        let i = Interner::default();
        let mut a = HashCached::new(5u8);
        let mut b = HashCached::new(5u8);
        i.intern(0, &mut a);
        i.intern(1, &mut b);
        assert!(!HashCached::ptr_eq(&a, &b));
        assert_eq!(i.len(), 2);
    }
}
