//! How far apart two names are, for naming the variable a misspelt one meant.

/// Levenshtein distance: the fewest insertions, deletions and substitutions
/// that turn `a` into `b`.
pub fn edit_distance(a: &[u8], b: &[u8]) -> usize {
    let mut previous: Vec<usize> = (0..=b.len()).collect();
    for (i, &ca) in a.iter().enumerate() {
        let mut current = vec![i + 1];
        for (j, &cb) in b.iter().enumerate() {
            let substitution = previous[j] + usize::from(ca != cb);
            current.push(substitution.min(previous[j + 1] + 1).min(current[j] + 1));
        }
        previous = current;
    }
    previous[b.len()]
}

#[cfg(test)]
mod tests {
    use super::edit_distance;

    #[test]
    fn counts_insertions_deletions_and_substitutions() {
        assert_eq!(edit_distance(b"SOMA_STATS", b"SOMA_STATS"), 0);
        assert_eq!(edit_distance(b"SOMA_STAT", b"SOMA_STATS"), 1);
        assert_eq!(edit_distance(b"SOMA_DISABEL", b"SOMA_DISABLE"), 2);
        assert_eq!(edit_distance(b"", b"ABC"), 3);
        assert_eq!(edit_distance(b"SOMA_HOME", b"SOMA_POOL"), 3);
    }
}
