//! [`clone_by_fields!`]: `Clone` for a model-state struct whose `clone_from` keeps the
//! destination's allocations. The explorer applies every enabled action to a copy of the state
//! it expands, and most of those successors were seen before and are dropped at once; copying
//! into one scratch state with `clone_from` reuses its vectors instead of allocating and freeing
//! dozens of them per transition. A derived `Clone` cannot do that: its `clone_from` is
//! `*self = source.clone()`.

/// Implement `Clone` for struct `$ty` from its field list: `clone` clones each field,
/// `clone_from` calls each field's own `clone_from` (so a `Vec` keeps its buffer, and a nested
/// struct declared with this macro does the same all the way down).
///
/// The list must name every field: both the struct literal and the destructuring pattern the
/// macro generates are exhaustive, so a field added to the struct and not to the list is a
/// compile error, never a field silently left stale in a reused state.
#[macro_export]
macro_rules! clone_by_fields {
    ($ty:ident $(<$($g:ident),*>)? { $($f:ident),* $(,)? }) => {
        impl $(<$($g: Clone),*>)? Clone for $ty $(<$($g),*>)? {
            #[inline]
            fn clone(&self) -> Self {
                let $ty { $($f),* } = self;
                $ty { $($f: $f.clone()),* }
            }
            #[inline]
            fn clone_from(&mut self, source: &Self) {
                let $ty { $($f),* } = source;
                $(self.$f.clone_from($f);)*
            }
        }
    };
}

/// Implement `Clone` for enum `$ty` whose variants each hold one value (`Variant(T)`):
/// `clone_from` between two values of the same variant calls the payload's `clone_from` (a
/// `Box` keeps its allocation); otherwise it clones. The `clone` match is exhaustive, so a
/// variant missing from the list is a compile error.
#[macro_export]
macro_rules! clone_by_variants {
    ($ty:ident { $($v:ident),* $(,)? }) => {
        impl Clone for $ty {
            #[inline]
            fn clone(&self) -> Self {
                match self {
                    $($ty::$v(x) => $ty::$v(x.clone()),)*
                }
            }
            #[inline]
            fn clone_from(&mut self, source: &Self) {
                match (self, source) {
                    $(($ty::$v(a), $ty::$v(b)) => a.clone_from(b),)*
                    (a, b) => *a = b.clone(),
                }
            }
        }
    };
}
