//! Why a pipeline's partitions are paused, as plain state: the admin API's pause, the
//! dependency health (degraded: a record waits for an unavailable dependency), and the
//! partitions held one by one because their next record is in hand (queue full, the
//! uncommitted window full, or not yet due). It makes no consumer call: each change
//! returns the [`Fetch`] the driver applies to its consumer.

use std::collections::HashSet;

use super::assignment::TopicPartition;

/// What to do to the consumer's fetching after a change.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Fetch {
    /// Nothing.
    Unchanged,
    /// Pause every assigned partition.
    PauseAll,
    /// Resume every assigned partition that is not held.
    ResumeUnheld,
    /// Pause one partition.
    Pause(TopicPartition),
    /// Resume one partition.
    Resume(TopicPartition),
}

/// The pause state of one pipeline; it outlives a restart of its stage.
#[derive(Debug, Default, Clone)]
pub(crate) struct PauseState {
    /// Paused through the admin API (lasts across rebalances and restarts).
    admin: bool,
    /// Paused because the pipeline is degraded.
    degraded: bool,
    /// Partitions paused one by one: the records in hand reached their bound (see
    /// `stash::refetch_due`).
    held: HashSet<TopicPartition>,
}

impl PauseState {
    /// The admin API paused the pipeline.
    pub(crate) fn pause(&mut self) -> Fetch {
        self.admin = true;
        Fetch::PauseAll
    }

    /// The admin API resumed it: the partitions that nothing else holds fetch again, unless
    /// the pipeline is degraded (they resume when that ends).
    pub(crate) fn resume(&mut self) -> Fetch {
        self.admin = false;
        if self.degraded {
            Fetch::Unchanged
        } else {
            Fetch::ResumeUnheld
        }
    }

    /// The admin pause as the pipeline's status says, when the stage (re)starts: the API may
    /// have changed it while the stage was down.
    pub(crate) fn set_admin(&mut self, paused: bool) {
        self.admin = paused;
    }

    /// The dependency health now; `None` when it did not change. Degraded pauses every
    /// partition; healthy again resumes them, unless the admin API paused the pipeline.
    pub(crate) fn health(&mut self, degraded: bool) -> Option<Fetch> {
        if degraded == self.degraded {
            return None;
        }
        self.degraded = degraded;
        Some(if degraded {
            Fetch::PauseAll
        } else if self.admin {
            Fetch::Unchanged
        } else {
            Fetch::ResumeUnheld
        })
    }

    /// Partition `tp`'s next record cannot be handed over yet: it stops fetching.
    pub(crate) fn hold(&mut self, tp: &TopicPartition) -> Fetch {
        if self.held.insert(tp.clone()) {
            Fetch::Pause(tp.clone())
        } else {
            Fetch::Unchanged
        }
    }

    /// Partition `tp` may fetch again (its stash is low enough): it does, unless the whole
    /// pipeline is paused (it resumes with the others then).
    pub(crate) fn release(&mut self, tp: &TopicPartition) -> Fetch {
        if self.held.remove(tp) && self.flowing() {
            Fetch::Resume(tp.clone())
        } else {
            Fetch::Unchanged
        }
    }

    /// Partition `tp` was revoked: a later assignment of it starts unheld.
    pub(crate) fn revoked(&mut self, tp: &TopicPartition) {
        self.held.remove(tp);
    }

    /// Whether newly assigned partitions start paused. librdkafka keeps an application
    /// pause across re-assignment, so new partitions are always paused or resumed
    /// explicitly: paused while the pipeline is paused or degraded.
    pub(crate) fn assigned_paused(&self) -> bool {
        !self.flowing()
    }

    /// Neither paused nor degraded: stashed records may be handed over.
    pub(crate) fn flowing(&self) -> bool {
        !self.admin && !self.degraded
    }

    pub(crate) fn is_held(&self, tp: &TopicPartition) -> bool {
        self.held.contains(tp)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tp(p: i32) -> TopicPartition {
        ("t".to_owned(), p)
    }

    #[test]
    fn an_admin_pause_outlasts_a_degradation() {
        let mut s = PauseState::default();
        assert_eq!(s.pause(), Fetch::PauseAll);
        assert_eq!(s.health(true), Some(Fetch::PauseAll));
        // Healthy again, still paused by the admin.
        assert_eq!(s.health(false), Some(Fetch::Unchanged));
        assert!(!s.flowing() && s.assigned_paused());
        assert_eq!(s.resume(), Fetch::ResumeUnheld);
        assert!(s.flowing() && !s.assigned_paused());
    }

    #[test]
    fn a_degradation_outlasts_an_admin_resume() {
        let mut s = PauseState::default();
        assert_eq!(s.health(true), Some(Fetch::PauseAll));
        assert_eq!(s.pause(), Fetch::PauseAll);
        assert_eq!(s.resume(), Fetch::Unchanged, "still degraded");
        assert!(s.assigned_paused());
        assert_eq!(s.health(false), Some(Fetch::ResumeUnheld));
        assert!(s.flowing());
    }

    #[test]
    fn the_health_acts_only_when_it_changes() {
        let mut s = PauseState::default();
        assert_eq!(s.health(false), None);
        assert_eq!(s.health(true), Some(Fetch::PauseAll));
        assert_eq!(s.health(true), None);
        assert_eq!(s.health(false), Some(Fetch::ResumeUnheld));
        assert_eq!(s.health(false), None);
    }

    #[test]
    fn a_partition_is_paused_once_and_resumed_once() {
        let mut s = PauseState::default();
        assert_eq!(s.hold(&tp(1)), Fetch::Pause(tp(1)));
        assert_eq!(s.hold(&tp(1)), Fetch::Unchanged, "already paused");
        assert!(s.is_held(&tp(1)) && !s.is_held(&tp(2)));
        assert_eq!(s.release(&tp(2)), Fetch::Unchanged, "never held");
        assert_eq!(s.release(&tp(1)), Fetch::Resume(tp(1)));
        assert!(!s.is_held(&tp(1)));
        assert_eq!(s.release(&tp(1)), Fetch::Unchanged);
    }

    #[test]
    fn a_held_partition_released_while_the_pipeline_is_paused_resumes_with_the_others() {
        let mut s = PauseState::default();
        assert_eq!(s.hold(&tp(1)), Fetch::Pause(tp(1)));
        assert_eq!(s.hold(&tp(2)), Fetch::Pause(tp(2)));
        s.pause();
        assert_eq!(s.release(&tp(1)), Fetch::Unchanged, "the pipeline is paused");
        assert!(!s.is_held(&tp(1)), "no longer held");
        // The resume of the pipeline resumes it, and leaves the other held one paused.
        assert_eq!(s.resume(), Fetch::ResumeUnheld);
        assert!(!s.is_held(&tp(1)) && s.is_held(&tp(2)));
    }

    #[test]
    fn a_revoked_partition_comes_back_unheld_and_follows_the_pipeline() {
        let mut s = PauseState::default();
        s.hold(&tp(3));
        s.revoked(&tp(3));
        assert!(!s.is_held(&tp(3)));
        assert!(!s.assigned_paused());
        s.set_admin(true);
        assert!(s.assigned_paused(), "an admin pause set while the stage was down holds new partitions");
        s.set_admin(false);
        s.health(true);
        assert!(s.assigned_paused(), "so does a degradation");
    }
}
