//! [`digest`]: the 128-bit XXH3 digest of anything hashable, the explorer's fingerprint of a
//! state and of its [`HashCached`] components.
//!
//! The value's `Hash` writes (several hundred small ones for a machine) are gathered in a
//! per-thread buffer and hashed in one pass: the same digest as feeding them to a streaming
//! XXH3 one by one, about a fifth cheaper (a write is then a copy of a few bytes). A digest
//! taken while another is being gathered (a component's, inside the state's) uses a buffer of
//! its own.

use crate::shared::Shared;
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

/// A component of a model state (a CPU, a task, an mm) that remembers its [`digest`] and is
/// [`Shared`], copy-on-write, between the states that hold it unchanged: the state's `Hash`
/// writes the 16-byte digest instead of the component's fields, and computes it only when the
/// component changed since it was last taken; a copy of the state shares the component until
/// one of them changes it.
///
/// Why: the explorer copies every state it expands once per successor, and a step changes one
/// or two components; the others keep their parent's digest and memory. Soundness rests on one
/// rule, which the type enforces: the value is reachable mutably only through `DerefMut`,
/// which takes a private copy if the component is shared and forgets its digest. (So a `&mut`
/// borrow that only reads costs a recomputation, never a stale digest.) `tests/state_copy.rs`
/// checks, on every scenario, that every remembered digest equals a fresh one.
///
/// Equality, `Debug` and `Serialize` are the value's.
pub struct HashCached<T> {
    inner: Shared<Digested<T>>,
}

/// Something done to each [`HashCached`] component of a state: a state lists its components
/// once (a `visit_components` of its own) for every such use — forgetting their digests,
/// interning them. `index` is the component's place in its list (0 for one alone): with its
/// type, it names which component this is, whose fields fixed for a run (a task's name and
/// program, which its digest leaves out) are the same in every state of the run.
pub trait Components {
    fn component<T: Clone + Hash + Send + Sync + 'static>(
        &mut self,
        index: usize,
        c: &mut HashCached<T>,
    );
}

/// The value and its digest with its lowest bit set, split in two words; `lo == 0` means not
/// known. (Atomics: states are shared between the explorer's threads, and two of them may take
/// a digest at once — they store the same value. `hi` is stored before `lo` is released.)
///
/// The digest first (`repr(C)`): a mutable borrow writes `lo`, and beside the sharing flag it
/// shares a cache line with the value's first fields (see [`Shared`]'s layout).
#[repr(C)]
struct Digested<T> {
    lo: AtomicU64,
    hi: AtomicU64,
    value: T,
}

/// A private copy for a writer: the value, without the digest it is about to change.
impl<T: Clone> Clone for Digested<T> {
    fn clone(&self) -> Self {
        Digested {
            lo: AtomicU64::new(0),
            hi: AtomicU64::new(0),
            value: self.value.clone(),
        }
    }
}
impl<T: Default> Default for HashCached<T> {
    fn default() -> Self {
        HashCached::new(T::default())
    }
}
impl<T> HashCached<T> {
    /// A component of its own (shared once the state holding it is copied).
    pub fn new(value: T) -> Self {
        HashCached {
            inner: Shared::new(Digested {
                lo: AtomicU64::new(0),
                hi: AtomicU64::new(0),
                value,
            }),
        }
    }
    /// Whether `a` and `b` hold the very same value.
    pub fn ptr_eq(a: &Self, b: &Self) -> bool {
        Shared::ptr_eq(&a.inner, &b.inner)
    }
    /// How many handles share the value (1: this one alone).
    pub fn handles(this: &Self) -> usize {
        Shared::handles(&this.inner)
    }
    /// The remembered digest, if any (for tests).
    pub fn remembered(&self) -> Option<u128> {
        match self.inner.lo.load(Ordering::Acquire) {
            0 => None,
            lo => Some((self.inner.hi.load(Ordering::Relaxed) as u128) << 64 | lo as u128),
        }
    }
}
impl<T: Clone> HashCached<T> {
    /// Forget the digest (for tests: the next one is computed afresh).
    pub fn forget(&mut self) {
        *self.inner.lo.get_mut() = 0;
    }
}
impl<T: Hash> HashCached<T> {
    /// The value's digest (with its lowest bit set): remembered, or computed and remembered.
    pub fn digest(&self) -> u128 {
        if let Some(d) = self.remembered() {
            return d;
        }
        let d = digest(&self.inner.value) | 1;
        self.inner.hi.store((d >> 64) as u64, Ordering::Relaxed);
        self.inner.lo.store(d as u64, Ordering::Release);
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
        &self.inner.value
    }
}
impl<T: Clone> DerefMut for HashCached<T> {
    #[inline(always)]
    fn deref_mut(&mut self) -> &mut T {
        let i = &mut *self.inner;
        *i.lo.get_mut() = 0;
        &mut i.value
    }
}
impl<T> From<T> for HashCached<T> {
    fn from(value: T) -> Self {
        HashCached::new(value)
    }
}
/// A copy shares the component (and its digest); `clone_from` too, dropping the destination's.
impl<T> Clone for HashCached<T> {
    fn clone(&self) -> Self {
        HashCached {
            inner: self.inner.clone(),
        }
    }
    fn clone_from(&mut self, source: &Self) {
        self.inner.clone_from(&source.inner);
    }
}

impl<T: PartialEq> PartialEq for HashCached<T> {
    fn eq(&self, other: &Self) -> bool {
        self.inner.value == other.inner.value
    }
}
impl<T: Eq> Eq for HashCached<T> {}

impl<T: std::fmt::Debug> std::fmt::Debug for HashCached<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.inner.value.fmt(f)
    }
}

impl<T: serde::Serialize> serde::Serialize for HashCached<T> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.inner.value.serialize(s)
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
    fn a_copy_shares_its_digest_until_one_side_writes() {
        let a = HashCached::new(vec![1u32]);
        let da = a.digest();
        let mut b = a.clone();
        assert!(Shared::ptr_eq(&a.inner, &b.inner));
        b.push(2);
        assert!(!Shared::ptr_eq(&a.inner, &b.inner));
        assert_eq!((&*a, &*b), (&vec![1], &vec![1, 2]));
        assert_eq!(a.remembered(), Some(da), "the other side keeps its digest");
        assert_eq!(b.remembered(), None);
        assert_eq!(b.digest(), digest(&vec![1u32, 2]) | 1);
    }

    #[test]
    fn nested_digests_use_their_own_buffers() {
        let inner = vec![HashCached::new(5u64), HashCached::new(6u64)];
        let outer = digest(&inner);
        let flat = digest(&[digest(&5u64) | 1, digest(&6u64) | 1][..]);
        assert_eq!(outer, flat);
    }
}
