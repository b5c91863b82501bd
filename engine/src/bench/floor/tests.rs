#[test]
fn the_ledger_floor_tries_powers_of_two_up_to_the_clients() {
    assert_eq!(super::connection_counts(8), vec![1, 2, 4, 8]);
    assert_eq!(super::connection_counts(6), vec![1, 2, 4, 6]);
    assert_eq!(super::connection_counts(1), vec![1]);
    assert_eq!(super::connection_counts(0), vec![1]);
}
