//! "Did you mean …?": the closest of some names to a name that was not found.

/// The name of `candidates` closest to `name` (case-insensitive edit distance), if it is close enough to
/// be a likely misspelling: at most a third of the longer name's characters differ (at least one may).
pub fn closest<'a>(name: &str, candidates: impl IntoIterator<Item = &'a str>) -> Option<&'a str> {
    let lower = name.to_lowercase();
    candidates
        .into_iter()
        .map(|c| (strsim::levenshtein(&lower, &c.to_lowercase()), c))
        .filter(|&(d, c)| d <= (name.chars().count().max(c.chars().count()) / 3).max(1))
        .min_by_key(|&(d, _)| d)
        .map(|(_, c)| c)
}

#[cfg(test)]
mod tests {
    use super::closest;

    #[test]
    fn suggests_only_close_names() {
        let names = ["features", "labels"];
        assert_eq!(closest("featurs", names), Some("features"));
        assert_eq!(closest("Labels", names), Some("labels"));
        assert_eq!(closest("lbl", names), None);
        assert_eq!(closest("x", ["y"]), Some("y"));
        assert_eq!(closest("x", ["yz"]), None);
        assert_eq!(closest("anything", std::iter::empty()), None);
    }
}
