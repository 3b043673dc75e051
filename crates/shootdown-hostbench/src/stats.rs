//! Summary statistics of the per-repetition times.

/// (median, min, max) of `xs`; NaNs for an empty slice. The median of an even count is the
/// mean of the two middle values.
pub(crate) fn summary(xs: &[f64]) -> (f64, f64, f64) {
    if xs.is_empty() {
        return (f64::NAN, f64::NAN, f64::NAN);
    }
    let mut v = xs.to_vec();
    v.sort_by(f64::total_cmp);
    let n = v.len();
    let median = if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    };
    (median, v[0], v[n - 1])
}

#[cfg(test)]
mod tests {
    use super::summary;

    #[test]
    fn odd_and_even_counts() {
        assert_eq!(summary(&[3.0, 1.0, 2.0]), (2.0, 1.0, 3.0));
        assert_eq!(summary(&[4.0, 1.0, 2.0, 3.0]), (2.5, 1.0, 4.0));
        assert!(summary(&[]).0.is_nan());
    }
}
