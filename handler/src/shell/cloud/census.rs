//! The census of the UUIDs the inventory's Systems serve: a UUID is a
//! machine's identity only when no other System serves it. One round reads
//! every System at a time (single-flight), without holding what the looks
//! read: a fencing judges against the census as it stands and never waits
//! for a BMC other than its machine's, except for the process's first
//! round, which every UUID needs once. A System that does not answer keeps
//! the UUID it served when last read; one never read holds back no other
//! machine's fencing ([`identity::unique_among_systems`]). What the rounds
//! read outlives the process in a [`CensusStore`] (an annotation of the
//! witness Lease in the control namespace), so a restart forgets no UUID:
//! read by the process's first round, left by each witness round that may
//! write (never in a dry run).

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::Duration;

use async_trait::async_trait;
use futures::StreamExt;
use tokio::time::Instant;

use crate::core::model::facts::InstanceFacts;
use crate::core::model::instance::InstanceId;
use crate::core::model::redfish::SystemUuid;
use crate::core::rules::identity;

/// How long the UUIDs the inventory's Systems served count as current: a
/// look that needs them starts a new round after that.
pub(super) const CENSUS_AGE: Duration = Duration::from_secs(60);
/// How many BMCs a round reads at once.
pub(super) const CENSUS_PARALLEL: usize = 8;

/// What the inventory's Systems served, and when a round last ended.
#[derive(Default)]
struct Served {
    uuids: BTreeMap<InstanceId, SystemUuid>,
    asked_at: Option<Instant>,
}

/// Where the census outlives the process: the UUID each System served
/// when last read, printed, by machine id.
#[async_trait]
pub trait CensusStore: Send + Sync {
    /// What an earlier process left; empty before the first.
    async fn load(&self) -> Result<BTreeMap<String, String>, String>;
    /// Leaves `uuids` for the next process.
    async fn save(&self, uuids: &BTreeMap<String, String>) -> Result<(), String>;
}

/// The census; shared with the round a look starts in the background.
pub(super) struct Census {
    /// How long a round counts as current.
    age: Duration,
    served: Mutex<Served>,
    /// Held by the one round under way; true once the store was read.
    round: tokio::sync::Mutex<bool>,
    store: OnceLock<Arc<dyn CensusStore>>,
}

/// How current the census is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Age {
    /// No round has ended in this process.
    Unread,
    /// Older than [`CENSUS_AGE`].
    Stale,
    /// Current.
    Fresh,
}

impl Census {
    /// A census whose rounds count as current for `age`.
    fn new(age: Duration) -> Self {
        Self {
            age,
            served: Mutex::default(),
            round: tokio::sync::Mutex::default(),
            store: OnceLock::new(),
        }
    }

    fn served(&self) -> MutexGuard<'_, Served> {
        self.served
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Reads what an earlier process left in `store` at the first round;
    /// the first store given stays.
    pub(super) fn kept_in(&self, store: Arc<dyn CensusStore>) {
        let _ = self.store.set(store);
    }

    /// Takes what an earlier process left, for every System this one has
    /// not read itself.
    async fn load(&self, store: &dyn CensusStore) {
        let left = match store.load().await {
            Ok(left) => left,
            Err(e) => {
                tracing::warn!(error = %e, "the census an earlier process left could not be read");
                return;
            }
        };
        let mut served = self.served();
        for (id, uuid) in left {
            let Some(id) = InstanceId::parse(&id).filter(|id| id.as_redfish().is_some()) else {
                continue;
            };
            let uuid = SystemUuid::parse(Some(&uuid));
            if uuid.key().is_some() {
                served.uuids.entry(id).or_insert(uuid);
            }
        }
    }

    /// Leaves every UUID known for the next process.
    pub(super) async fn save(&self, store: &dyn CensusStore) {
        let printed: BTreeMap<String, String> = self
            .served()
            .uuids
            .iter()
            .filter_map(|(id, uuid)| Some((id.to_string(), uuid.printed()?)))
            .collect();
        if let Err(e) = store.save(&printed).await {
            tracing::warn!(error = %e, "the census could not be kept for the next process");
        }
    }

    fn age(&self) -> Age {
        match self.served().asked_at {
            None => Age::Unread,
            Some(at) if at.elapsed() > self.age => Age::Stale,
            Some(_) => Age::Fresh,
        }
    }

    /// Records what `found` served just now.
    fn record(&self, found: &[InstanceFacts]) {
        let mut served = self.served();
        for facts in found {
            served
                .uuids
                .insert(facts.id.clone(), facts.identity.system_uuid);
        }
    }

    /// Reads every System of `all` but `skip` with `read` (`None`: not
    /// read), unless another round is under way or has just ended.
    async fn round<F, Fut>(&self, all: &[InstanceId], skip: &[InstanceId], read: F)
    where
        F: Fn(InstanceId) -> Fut,
        Fut: Future<Output = (InstanceId, Option<SystemUuid>)>,
    {
        let mut loaded = self.round.lock().await;
        let store = self.store.get().cloned();
        if let Some(store) = &store
            && !*loaded
        {
            self.load(store.as_ref()).await;
            *loaded = true;
        }
        if self.age() == Age::Fresh {
            return;
        }
        let asked: Vec<InstanceId> = all
            .iter()
            .filter(|id| !skip.contains(id))
            .cloned()
            .collect();
        let read: Vec<(InstanceId, Option<SystemUuid>)> =
            futures::stream::iter(asked.into_iter().map(read))
                .buffer_unordered(CENSUS_PARALLEL)
                .collect()
                .await;
        {
            let mut served = self.served();
            for (id, uuid) in read {
                if let Some(uuid) = uuid {
                    served.uuids.insert(id, uuid);
                }
            }
            served.asked_at = Some(Instant::now());
        }
    }

    /// Holds each UUID of `found` to what the other Systems of `all` served.
    fn judge(&self, all: &[InstanceId], found: &mut [InstanceFacts]) {
        let served = self.served();
        for facts in found.iter_mut() {
            let others = all
                .iter()
                .filter(|id| **id != facts.id)
                .map(|id| served.uuids.get(id).copied());
            let held = identity::unique_among_systems(facts.identity.system_uuid, others);
            if let Some(doubt) = held.doubt() {
                tracing::warn!(machine = %facts.id, reason = doubt.code(), "{doubt}");
            }
            facts.identity.system_uuid = held;
        }
    }
}

/// Holds each UUID of `found` to every other System of `all` (the
/// inventory's), reading them with `read` as [`Census`] says: the first
/// round waited for, a stale census judged as it stands while a new round
/// runs in the background.
pub(super) async fn hold_unique<F, Fut>(
    census: &Arc<Census>,
    all: Vec<InstanceId>,
    found: &mut [InstanceFacts],
    read: F,
) where
    F: Fn(InstanceId) -> Fut + Send + 'static,
    Fut: Future<Output = (InstanceId, Option<SystemUuid>)> + Send + 'static,
{
    census.record(found);
    if found.iter().all(|f| f.identity.system_uuid.key().is_none()) {
        return;
    }
    let skip: Vec<InstanceId> = found.iter().map(|f| f.id.clone()).collect();
    match census.age() {
        Age::Fresh => {}
        Age::Unread => census.round(&all, &skip, read).await,
        Age::Stale => {
            let (census, all) = (census.clone(), all.clone());
            tokio::spawn(async move { census.round(&all, &skip, read).await });
        }
    }
    census.judge(&all, found);
}

/// [`CensusStore`] over the witness Lease in the control namespace.
pub struct LeaseCensus {
    /// The cluster.
    pub cluster: crate::shell::cluster::Kube,
    /// The control namespace.
    pub namespace: String,
    /// Who writes it (the reporter's name).
    pub holder: String,
}

#[async_trait]
impl CensusStore for LeaseCensus {
    async fn load(&self) -> Result<BTreeMap<String, String>, String> {
        let text = self
            .cluster
            .read_system_uuids(&self.namespace)
            .await
            .map_err(|e| e.to_string())?;
        match text {
            None => Ok(BTreeMap::new()),
            Some(text) => serde_json::from_str(&text)
                .map_err(|e| format!("the kept census does not parse: {e}")),
        }
    }

    async fn save(&self, uuids: &BTreeMap<String, String>) -> Result<(), String> {
        let text = serde_json::to_string(uuids).map_err(|e| e.to_string())?;
        self.cluster
            .write_system_uuids(&self.namespace, &text, &self.holder)
            .await
            .map_err(|e| e.to_string())
    }
}

impl Default for Census {
    fn default() -> Self {
        Self::new(CENSUS_AGE)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::model::instance::InstanceState;
    use crate::core::model::redfish::Doubt;
    use std::sync::atomic::{AtomicUsize, Ordering};

    const A: &str = "27946b59-9e44-4fa7-8e91-f3527a1ef094";
    const B: &str = "4c4c4544-0042-3510-8052-b4c04f4d3732";

    fn machine(n: u8) -> InstanceId {
        InstanceId::parse(&format!("redfish://rack1-m{n}")).unwrap()
    }

    fn facts(n: u8, uuid: &str) -> InstanceFacts {
        let mut f = InstanceFacts::bare(machine(n), InstanceState::Stopped);
        f.identity.system_uuid = SystemUuid::parse(Some(uuid));
        f
    }

    /// Issue 58, item 2: one BMC dark and one refusing the credentials,
    /// from the start: the machine whose UUID is otherwise its own is
    /// judged by it, and a share with a System that answered still counts.
    #[tokio::test]
    async fn a_dark_system_is_no_veto_and_a_shared_uuid_still_is() {
        let census = Arc::new(Census::default());
        let all = vec![machine(1), machine(2), machine(3), machine(4)];
        let read = |id: InstanceId| async move {
            let uuid = match id.as_str() {
                "redfish://rack1-m4" => Some(SystemUuid::parse(Some(B))),
                _ => None,
            };
            (id, uuid)
        };
        let mut found = [facts(1, A)];
        hold_unique(&census, all.clone(), &mut found, read).await;
        assert_eq!(found[0].identity.system_uuid, SystemUuid::parse(Some(A)));
        let mut shared = [facts(1, B)];
        hold_unique(&census, all, &mut shared, read).await;
        assert_eq!(
            shared[0].identity.system_uuid,
            SystemUuid::Doubtful(Doubt::SharedBySystems)
        );
    }

    /// A store in memory, as the witness Lease keeps it between processes.
    #[derive(Default)]
    struct Kept(Mutex<BTreeMap<String, String>>);

    #[async_trait]
    impl CensusStore for Kept {
        async fn load(&self) -> Result<BTreeMap<String, String>, String> {
            Ok(self.0.lock().unwrap().clone())
        }
        async fn save(&self, uuids: &BTreeMap<String, String>) -> Result<(), String> {
            *self.0.lock().unwrap() = uuids.clone();
            Ok(())
        }
    }

    /// Issue 58, item 2: what a System served outlives the process. A board
    /// that shares machine 1's UUID and goes dark after a first round is
    /// still known to share it after a restart; one the store never held is
    /// no veto.
    #[tokio::test]
    async fn a_restart_forgets_no_uuid() {
        let kept = Arc::new(Kept::default());
        let all = vec![machine(1), machine(2), machine(3)];
        let first = Arc::new(Census::default());
        first.kept_in(kept.clone());
        let answering = |id: InstanceId| async move {
            let uuid = (id == machine(2)).then(|| SystemUuid::parse(Some(A)));
            (id, uuid)
        };
        let mut found = [facts(1, A)];
        hold_unique(&first, all.clone(), &mut found, answering).await;
        assert_eq!(
            found[0].identity.system_uuid,
            SystemUuid::Doubtful(Doubt::SharedBySystems)
        );
        assert!(kept.0.lock().unwrap().is_empty(), "a look writes nothing");
        first.save(kept.as_ref()).await;
        assert_eq!(
            kept.0
                .lock()
                .unwrap()
                .get("redfish://rack1-m2")
                .map(String::as_str),
            Some(A)
        );

        let restarted = Arc::new(Census::default());
        restarted.kept_in(kept.clone());
        let dark = |id: InstanceId| async move { (id, None) };
        let mut found = [facts(1, A)];
        hold_unique(&restarted, all.clone(), &mut found, dark).await;
        assert_eq!(
            found[0].identity.system_uuid,
            SystemUuid::Doubtful(Doubt::SharedBySystems),
            "machine 2's UUID, kept across the restart"
        );
        let mut other = [facts(3, B)];
        hold_unique(&restarted, all, &mut other, dark).await;
        assert_eq!(other[0].identity.system_uuid, SystemUuid::parse(Some(B)));
    }

    /// The first round is waited for; later looks within the census' age
    /// read no other System; a stale census is judged as it stands while
    /// one round, never two, runs behind.
    #[tokio::test]
    async fn one_round_at_a_time_and_only_the_first_waited_for() {
        let age = Duration::from_millis(200);
        let census = Arc::new(Census::new(age));
        let all = vec![machine(1), machine(2)];
        let reads = Arc::new(AtomicUsize::new(0));
        let slow = Duration::from_millis(400);
        let reader = |reads: Arc<AtomicUsize>| {
            move |id: InstanceId| {
                let reads = reads.clone();
                async move {
                    reads.fetch_add(1, Ordering::SeqCst);
                    tokio::time::sleep(slow).await;
                    (id, Some(SystemUuid::parse(Some(B))))
                }
            }
        };
        let started = Instant::now();
        let mut found = [facts(1, A)];
        hold_unique(&census, all.clone(), &mut found, reader(reads.clone())).await;
        assert!(started.elapsed() >= slow, "the first round is waited for");
        assert_eq!(reads.load(Ordering::SeqCst), 1);
        hold_unique(&census, all.clone(), &mut found, reader(reads.clone())).await;
        assert_eq!(reads.load(Ordering::SeqCst), 1, "current: nothing read");

        tokio::time::sleep(age + Duration::from_millis(50)).await;
        let stale = Instant::now();
        for _ in 0..3 {
            let mut again = [facts(1, A)];
            hold_unique(&census, all.clone(), &mut again, reader(reads.clone())).await;
            assert_eq!(again[0].identity.system_uuid, SystemUuid::parse(Some(A)));
        }
        assert!(
            stale.elapsed() < slow / 2,
            "a stale census waits for no BMC: {:?}",
            stale.elapsed()
        );
        tokio::time::sleep(slow * 2).await;
        assert_eq!(
            reads.load(Ordering::SeqCst),
            2,
            "one round behind the three looks"
        );
    }
}
