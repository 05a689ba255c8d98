use super::*;

fn row(name: &str, keys: u64, oldest: Option<f64>) -> Row {
    Row {
        name: name.into(),
        keys,
        max_keys: 100,
        oldest_barrier: oldest,
        ..Row::other()
    }
}

#[test]
fn the_largest_get_series_and_a_namespace_named_other_joins_the_rest() {
    let rows = vec![
        row("a", 5, None),
        row("other", 9, Some(3.0)),
        row("b", 1, Some(7.5)),
        row("c", 3, None),
    ];
    let out = bucket(rows, 2);
    let names: Vec<&str> = out.iter().map(|r| r.name.as_str()).collect();
    assert_eq!(names, ["a", "c", "other"]);
    let other = &out[2];
    assert_eq!(other.keys, 10, "the namespace named other and b");
    assert_eq!(other.max_keys, 0, "quotas are never summed");
    assert_eq!(other.oldest_barrier, Some(7.5), "the oldest of the rest");
    // Room for all: no bucket, but a namespace named other still is one.
    let out = bucket(vec![row("a", 5, None), row("b", 1, None)], 20);
    assert_eq!(out.len(), 2);
    let out = bucket(vec![row("other", 5, None)], 20);
    assert_eq!((out.len(), out[0].max_keys), (1, 0));
}
