//! [`Shared`]: a part of a model state that the explorer's states share, copy-on-write, until
//! one of them writes it — and that costs the timed driver, which never copies a state, no
//! more than owning it.

use std::ops::{Deref, DerefMut};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// A value shared copy-on-write between the states that hold it unchanged.
///
/// Why: the explorer copies every state it expands once per successor, and a step writes one
/// or two of its parts; the others can stay where they are. A copy of a `Shared` shares the
/// value (`Arc`); the first mutable borrow through one of the handles takes a private copy
/// (`Arc::make_mut`).
///
/// The timed driver never copies a state, and a mutable borrow there must cost no more than a
/// plain one: the value records whether it was ever shared (set by `Clone`), and while it was
/// not, `DerefMut` writes in place without `make_mut`'s atomic read-modify-write.
///
/// Equality, `Debug` and `Serialize` are the value's.
pub struct Shared<T> {
    inner: Arc<Inner<T>>,
}

///
/// Laid out for the timed driver, where a step of one of thousands of CPUs misses the cache on
/// every line of that CPU's state it touches: aligned to a cache line, with the flag (which
/// every mutable borrow reads) first, so that it shares the first line with the reference
/// counts and the value's first fields — which a value laid out hot-first (`Cpu`, `Task`) makes
/// the fields a step reads.
#[repr(C, align(64))]
struct Inner<T> {
    /// Whether a second `Shared` may point here: set by `Clone` (through a shared borrow,
    /// hence an atomic; relaxed is enough, see `deref_mut`), cleared by the one owner that
    /// found itself alone again.
    shared: AtomicBool,
    value: T,
}

impl<T> Shared<T> {
    /// A value of its own (shared once the state holding it is copied).
    pub fn new(value: T) -> Self {
        Shared {
            inner: Arc::new(Inner {
                shared: AtomicBool::new(false),
                value,
            }),
        }
    }
    /// Whether `a` and `b` hold the very same value.
    pub fn ptr_eq(a: &Self, b: &Self) -> bool {
        Arc::ptr_eq(&a.inner, &b.inner)
    }
    /// How many handles share the value (1: this one alone).
    pub fn handles(this: &Self) -> usize {
        Arc::strong_count(&this.inner)
    }
}

impl<T> Deref for Shared<T> {
    type Target = T;
    #[inline]
    fn deref(&self) -> &T {
        &self.inner.value
    }
}

/// The value, made this handle's own: a private copy if another handle shares it.
impl<T: Clone> DerefMut for Shared<T> {
    /// Always inlined: the timed driver takes this path millions of times a second, and only
    /// the flag test belongs in the caller (the copy is `make_own`, out of line).
    #[inline(always)]
    fn deref_mut(&mut self) -> &mut T {
        // Relaxed suffices: `Clone` set `shared` through a shared borrow of this handle (or of
        // one it was copied from), and the `&mut self` we hold now was handed over after that
        // borrow ended, which orders the store before this load. A handle copied *from* this
        // one later cannot exist yet for the same reason.
        if self.inner.shared.load(Ordering::Relaxed) {
            return self.make_own();
        }
        // SAFETY: `shared` is false, so this `Arc` was never cloned since it was made (or
        // since `make_own` made it unique), and no `Weak` is ever made from it: its
        // strong count is 1 and `&mut self` is the only way to it — what `Arc::get_mut` would
        // check with an atomic operation.
        unsafe { &mut (*Arc::as_ptr(&self.inner).cast_mut()).value }
    }
}

impl<T: Clone> Shared<T> {
    /// The value of a handle that was shared, made its own: a private copy if another handle
    /// still shares it.
    #[cold]
    #[inline(never)]
    fn make_own(&mut self) -> &mut T {
        let i = Arc::make_mut(&mut self.inner);
        // Alone (make_mut copied, or found the other handles gone): in place from now on.
        *i.shared.get_mut() = false;
        &mut i.value
    }
}

/// A private copy for a writer.
impl<T: Clone> Clone for Inner<T> {
    fn clone(&self) -> Self {
        Inner {
            shared: AtomicBool::new(false),
            value: self.value.clone(),
        }
    }
}

/// A copy shares the value; `clone_from` too, dropping the destination's.
impl<T> Clone for Shared<T> {
    fn clone(&self) -> Self {
        self.inner.shared.store(true, Ordering::Relaxed);
        Shared {
            inner: self.inner.clone(),
        }
    }
    fn clone_from(&mut self, source: &Self) {
        if !Arc::ptr_eq(&self.inner, &source.inner) {
            *self = source.clone();
        }
    }
}

impl<T: Default> Default for Shared<T> {
    fn default() -> Self {
        Shared::new(T::default())
    }
}
impl<T> From<T> for Shared<T> {
    fn from(value: T) -> Self {
        Shared::new(value)
    }
}
impl<T: PartialEq> PartialEq for Shared<T> {
    fn eq(&self, other: &Self) -> bool {
        self.inner.value == other.inner.value
    }
}
impl<T: Eq> Eq for Shared<T> {}
impl<T: std::fmt::Debug> std::fmt::Debug for Shared<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.inner.value.fmt(f)
    }
}
impl<T: serde::Serialize> serde::Serialize for Shared<T> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.inner.value.serialize(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_copy_shares_until_one_side_writes() {
        let mut a = Shared::new(vec![1u32]);
        let mut b = a.clone();
        assert!(Shared::ptr_eq(&a, &b));
        b.push(2);
        assert!(!Shared::ptr_eq(&a, &b));
        assert_eq!((&*a, &*b), (&vec![1], &vec![1, 2]));
        a.push(3); // unique again: written in place
        assert_eq!(*a, vec![1, 3]);
    }

    #[test]
    fn an_unshared_value_is_written_in_place() {
        let mut a = Shared::new(vec![1u32]);
        let at = Arc::as_ptr(&a.inner);
        a.push(2);
        assert_eq!(Arc::as_ptr(&a.inner), at, "never shared: no copy");
        let b = a.clone();
        a.push(3);
        assert_ne!(Arc::as_ptr(&a.inner), at, "shared: a private copy");
        assert_eq!((&*a, &*b), (&vec![1, 2, 3], &vec![1, 2]));
        let mut b2 = b.clone();
        drop(b);
        let bt = Arc::as_ptr(&b2.inner);
        b2.push(4); // alone again: make_mut keeps it, and later writes skip the check
        b2.push(5);
        assert_eq!(Arc::as_ptr(&b2.inner), bt);
        assert!(!b2.inner.shared.load(Ordering::Relaxed));
        assert_eq!(*b2, vec![1, 2, 4, 5]);
        let mut c = Shared::new(vec![0u32]);
        c.clone_from(&b2); // clone_from shares too
        c.push(6);
        assert_eq!((&*b2, &*c), (&vec![1, 2, 4, 5], &vec![1, 2, 4, 5, 6]));
    }
}
