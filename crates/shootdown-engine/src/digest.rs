//! [`digest`]: the 128-bit XXH3 digest of anything hashable, the explorer's fingerprint of a
//! state and of its [`HashCached`] components.
//!
//! The value's `Hash` writes (several hundred small ones for a machine) are gathered in a
//! per-thread buffer and hashed in one pass: the same digest as feeding them to a streaming
//! XXH3 one by one, about a fifth cheaper (a write is then a copy of a few bytes). A digest
//! taken while another is being gathered (a component's, inside the state's) uses a buffer of
//! its own.

use std::cell::RefCell;
use std::hash::{Hash, Hasher};
use std::ops::{Deref, DerefMut};
use std::sync::atomic::{AtomicU64, Ordering};
use xxhash_rust::xxh3::xxh3_128;

/// 128-bit XXH3 digest of `x`'s `Hash` writes.
pub fn digest<T: Hash + ?Sized>(x: &T) -> u128 {
    thread_local! {
        /// Free buffers: one per level of digests being gathered at once on this thread.
        static BUFS: RefCell<Vec<Vec<u8>>> = const { RefCell::new(Vec::new()) };
    }
    let mut b = BUFS.with(|p| p.borrow_mut().pop()).unwrap_or_default();
    b.clear();
    x.hash(&mut Bytes(&mut b));
    let d = xxh3_128(&b);
    BUFS.with(|p| p.borrow_mut().push(b));
    d
}

/// A `Hasher` that only records the bytes written to it (for [`digest`]); the integer
/// writes are `Hasher`'s own, which pass the value's bytes to `write`.
struct Bytes<'a>(&'a mut Vec<u8>);
impl Hasher for Bytes<'_> {
    fn finish(&self) -> u64 {
        unreachable!("digest() hashes the bytes itself")
    }
    #[inline]
    fn write(&mut self, bytes: &[u8]) {
        self.0.extend_from_slice(bytes);
    }
}

/// A component of a model state (a CPU, a task, an mm) that remembers its [`digest`]: the
/// state's `Hash` writes the 16-byte digest instead of the component's fields, and computes it
/// only when the component changed since it was last taken.
///
/// Why: the explorer fingerprints every successor it builds, and a step changes one or two
/// components of a state copied from its parent; the others keep their parent's digests.
/// Soundness rests on one rule, which the type enforces: the value is reachable mutably only
/// through `DerefMut`, which forgets the digest. (So a `&mut` borrow that only reads costs a
/// recomputation, never a stale digest.) `tests/state_copy.rs` checks, on every scenario,
/// that every remembered digest equals a fresh one.
///
/// Equality, `Debug` and `Clone` are the value's (a clone keeps the digest, which is the
/// clone's too).
#[derive(Default)]
pub struct HashCached<T> {
    value: T,
    /// The digest with its lowest bit set, split in two words; `lo == 0` means not known.
    /// (Atomics: states are shared between the explorer's threads, and two of them may take
    /// a digest at once — they store the same value. `hi` is stored before `lo` is released.)
    lo: AtomicU64,
    hi: AtomicU64,
}

impl<T> HashCached<T> {
    pub fn new(value: T) -> Self {
        HashCached {
            value,
            lo: AtomicU64::new(0),
            hi: AtomicU64::new(0),
        }
    }

    pub fn into_inner(self) -> T {
        self.value
    }

    /// The remembered digest, if any (for tests).
    pub fn remembered(&self) -> Option<u128> {
        match self.lo.load(Ordering::Acquire) {
            0 => None,
            lo => Some((self.hi.load(Ordering::Relaxed) as u128) << 64 | lo as u128),
        }
    }

    /// Forget the digest (for tests: the next one is computed afresh).
    pub fn forget(&mut self) {
        *self.lo.get_mut() = 0;
    }
}

impl<T: Hash> HashCached<T> {
    /// The value's digest (with its lowest bit set): remembered, or computed and remembered.
    pub fn digest(&self) -> u128 {
        if let Some(d) = self.remembered() {
            return d;
        }
        let d = digest(&self.value) | 1;
        self.hi.store((d >> 64) as u64, Ordering::Relaxed);
        self.lo.store(d as u64, Ordering::Release);
        d
    }
}

impl<T: Hash> Hash for HashCached<T> {
    fn hash<H: Hasher>(&self, state: &mut H) {
        state.write_u128(self.digest());
    }
}

impl<T> Deref for HashCached<T> {
    type Target = T;
    #[inline]
    fn deref(&self) -> &T {
        &self.value
    }
}

impl<T> DerefMut for HashCached<T> {
    #[inline]
    fn deref_mut(&mut self) -> &mut T {
        *self.lo.get_mut() = 0;
        &mut self.value
    }
}

impl<T> From<T> for HashCached<T> {
    fn from(value: T) -> Self {
        HashCached::new(value)
    }
}

/// `clone_from` keeps the destination's allocations (see `clone_by_fields!`) and copies the
/// digest with the value.
impl<T: Clone> Clone for HashCached<T> {
    fn clone(&self) -> Self {
        let c = HashCached::new(self.value.clone());
        c.copy_digest(self);
        c
    }
    fn clone_from(&mut self, source: &Self) {
        self.value.clone_from(&source.value);
        self.copy_digest(source);
    }
}

impl<T> HashCached<T> {
    fn copy_digest(&self, source: &Self) {
        let lo = source.lo.load(Ordering::Acquire);
        self.hi
            .store(source.hi.load(Ordering::Relaxed), Ordering::Relaxed);
        self.lo.store(lo, Ordering::Release);
    }
}

impl<T: PartialEq> PartialEq for HashCached<T> {
    fn eq(&self, other: &Self) -> bool {
        self.value == other.value
    }
}
impl<T: Eq> Eq for HashCached<T> {}

impl<T: std::fmt::Debug> std::fmt::Debug for HashCached<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.value.fmt(f)
    }
}

impl<T: serde::Serialize> serde::Serialize for HashCached<T> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.value.serialize(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_mutable_borrow_forgets_the_digest() {
        let mut c = HashCached::new(vec![1u32, 2]);
        let d = c.digest();
        assert_eq!(c.remembered(), Some(d));
        c.push(3);
        assert_eq!(c.remembered(), None);
        assert_eq!(c.digest(), digest(&vec![1u32, 2, 3]) | 1);
        let copy = c.clone();
        assert_eq!(copy.remembered(), c.remembered());
        let mut other = HashCached::new(vec![9u32]);
        other.clone_from(&c);
        assert_eq!(other.remembered(), c.remembered());
        assert_eq!(*other, vec![1, 2, 3]);
    }

    #[test]
    fn nested_digests_use_their_own_buffers() {
        let inner = vec![HashCached::new(5u64), HashCached::new(6u64)];
        let outer = digest(&inner);
        let flat = digest(&[digest(&5u64) | 1, digest(&6u64) | 1][..]);
        assert_eq!(outer, flat);
    }
}
