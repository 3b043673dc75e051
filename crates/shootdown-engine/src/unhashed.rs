//! [`Unhashed`] wraps model data that must not distinguish states for the explorer (performance
//! counters, cache-line ownership for costs, statistics): it hashes to nothing and compares equal.

use std::hash::{Hash, Hasher};
use std::ops::{Deref, DerefMut};

#[derive(Debug, Default)]
pub struct Unhashed<T>(pub T);

/// `clone_from` keeps the destination's allocations (see `clone_by_fields!`).
impl<T: Clone> Clone for Unhashed<T> {
    fn clone(&self) -> Self {
        Unhashed(self.0.clone())
    }
    fn clone_from(&mut self, source: &Self) {
        self.0.clone_from(&source.0);
    }
}

impl<T> Hash for Unhashed<T> {
    fn hash<H: Hasher>(&self, _: &mut H) {}
}
impl<T> PartialEq for Unhashed<T> {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}
impl<T> Eq for Unhashed<T> {}
impl<T> Deref for Unhashed<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.0
    }
}
impl<T> DerefMut for Unhashed<T> {
    fn deref_mut(&mut self) -> &mut T {
        &mut self.0
    }
}
