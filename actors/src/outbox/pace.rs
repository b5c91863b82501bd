//! When a publish loop claims again, and over how many shards: see [`next_claim`].

use std::time::Duration;

use super::BatchOutcome;
use crate::store::outbox::Reach;

/// How soon after a ring a loop that found every shard held claims again, when no batch of
/// its own daemon ended first.
pub(super) const HELD_RETRY: Duration = Duration::from_millis(20);

/// What a loop waits for before its next claim.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Wait {
    /// Nothing: it claims again at once.
    No,
    /// A ring, or the poll interval.
    Ring,
    /// Another loop's batch to end, a ring and then `HELD_RETRY`, or the poll interval.
    BatchEnd,
}

/// What a loop heard of the bell over a batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Heard {
    /// It rang after the batch's claim began.
    pub(super) rang: bool,
    /// It hears other daemons' commits (a listener is up) as the batch ends.
    pub(super) hears: bool,
}

/// After a claim of `reach` that did `batch`, with what the loop `heard` of the bell: the
/// reach of the next claim, and what to wait for before it.
///
/// A loop sleeps once a claim of every free shard took all it found (no `more`) and no
/// ring came after it began. A row committed before that claim was in a shard it held, and
/// it took it; or in a shard another publisher held, which either took it too or began its
/// batch before the commit, heard the commit's ring, and claims again. Looking again until
/// a claim finds nothing would cost a row committed alone three or four transactions, each
/// locking shards, where one publishes it. That needs a bell that hears every commit: a
/// loop whose daemon does not hear other daemons (`outbox.listen` off, or its listener
/// down) keeps claiming until a sweep of every free shard finds nothing, because a row
/// another daemon committed into shards it held rang only there.
///
/// A claim that found every shard held waits for a batch to end. Each holder is in the
/// middle of a batch, and a loop only ever waits after a sweep of every free shard that
/// took all it found and during which no ring came (or after finding every shard held in
/// its turn), so a row whose ring came before finds its publisher without this loop;
/// claiming again at each ring would only spin on the database while the holder waits for
/// the broker. A holder in another daemon ends no batch here, and one whose daemon does not
/// hear the bell (its listener down) does not sweep again for a ring's row: a ring is
/// followed by another claim after `HELD_RETRY`.
pub(super) fn next_claim(reach: Reach, batch: &BatchOutcome, heard: Heard) -> (Reach, Wait) {
    match (batch.moved(), reach) {
        (0, _) if batch.no_free_shard => (Reach::Half, Wait::BatchEnd),
        (1.., _) if batch.more || heard.rang || !heard.hears => (Reach::Half, Wait::No),
        (_, Reach::Half) => (Reach::AllFree, Wait::No),
        (_, Reach::AllFree) if heard.rang => (Reach::AllFree, Wait::No),
        (_, Reach::AllFree) => (Reach::AllFree, Wait::Ring),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const QUIET: Heard = Heard { rang: false, hears: true };
    const RANG: Heard = Heard { rang: true, hears: true };
    const DEAF: Heard = Heard { rang: false, hears: false };

    #[test]
    fn a_loop_sleeps_only_after_a_sweep_of_every_free_shard_that_took_all_it_found() {
        let busy = BatchOutcome { published: 5, ..BatchOutcome::default() };
        let empty = BatchOutcome::default();
        for heard in [QUIET, RANG, DEAF] {
            // Nothing in this half: look at every free shard before sleeping.
            assert_eq!(next_claim(Reach::Half, &empty, heard), (Reach::AllFree, Wait::No));
        }
        // An empty sweep sleeps, unless a commit rang meanwhile: then it sweeps again.
        assert_eq!(next_claim(Reach::AllFree, &empty, QUIET), (Reach::AllFree, Wait::Ring));
        assert_eq!(next_claim(Reach::AllFree, &empty, DEAF), (Reach::AllFree, Wait::Ring));
        assert_eq!(next_claim(Reach::AllFree, &empty, RANG), (Reach::AllFree, Wait::No));
        // A half that had rows: the other half is still to be looked at.
        assert_eq!(next_claim(Reach::Half, &busy, QUIET), (Reach::AllFree, Wait::No));
        // A sweep that took every row it found, with no commit since it began: nothing is
        // left that this loop could miss, so it sleeps until the next ring.
        assert_eq!(next_claim(Reach::AllFree, &busy, QUIET), (Reach::AllFree, Wait::Ring));
    }

    #[test]
    fn a_loop_claims_again_while_rows_keep_coming() {
        let busy = BatchOutcome { published: 5, ..BatchOutcome::default() };
        let parked = BatchOutcome { parked: 1, held: 2, ..BatchOutcome::default() };
        for batch in [busy, parked] {
            for reach in [Reach::Half, Reach::AllFree] {
                // A commit rang while it ran.
                assert_eq!(next_claim(reach, &batch, RANG), (Reach::Half, Wait::No), "{reach:?}, rang");
                // It took as many rows as a claim may, or released held rows.
                let more = BatchOutcome { more: true, ..batch };
                for heard in [QUIET, RANG] {
                    assert_eq!(next_claim(reach, &more, heard), (Reach::Half, Wait::No), "{reach:?}, more");
                }
            }
        }
    }

    #[test]
    fn a_loop_that_does_not_hear_other_daemons_claims_again_until_it_finds_nothing() {
        // Another daemon's row committed into shards this loop held rang only there.
        let busy = BatchOutcome { published: 5, ..BatchOutcome::default() };
        for reach in [Reach::Half, Reach::AllFree] {
            assert_eq!(next_claim(reach, &busy, DEAF), (Reach::Half, Wait::No), "{reach:?}");
        }
    }

    #[test]
    fn a_loop_that_finds_every_shard_held_waits_for_a_batch_to_end() {
        let all_held = BatchOutcome { no_free_shard: true, ..BatchOutcome::default() };
        for (reach, rang) in
            [(Reach::Half, false), (Reach::Half, true), (Reach::AllFree, false), (Reach::AllFree, true)]
        {
            for hears in [false, true] {
                let heard = Heard { rang, hears };
                assert_eq!(next_claim(reach, &all_held, heard), (Reach::Half, Wait::BatchEnd), "{reach:?}, {heard:?}");
            }
        }
    }
}
