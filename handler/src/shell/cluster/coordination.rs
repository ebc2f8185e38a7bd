//! [`Coordination`] over `kube`: the fencing Lease (taken, renewed and
//! released with its resourceVersion), the census Lease, the kill switch;
//! and the witness's record, a Lease too.

use super::*;
#[async_trait]
impl Coordination for Kube {
    async fn read_census(&self, namespace: &str) -> Result<Option<Census>, ClusterError> {
        let api: Api<Lease> = Api::namespaced(self.client.clone(), namespace);
        let found = retrying("get census", || api.get_opt(control::CENSUS_NAME))
            .await
            .map_err(|source| ClusterError::Lease {
                namespace: namespace.into(),
                source,
            })?;
        Ok(found.as_ref().and_then(census_of))
    }

    async fn write_census(
        &self,
        namespace: &str,
        census: &Census,
        holder: &str,
    ) -> Result<(), ClusterError> {
        let counted_at = k8s_openapi::jiff::Timestamp::from_second(census.counted_at)
            .unwrap_or_else(|_| k8s_openapi::jiff::Timestamp::now());
        let annotations = [
            (control::CENSUS_OTHERS, census.others.to_string()),
            (control::CENSUS_SHARED, census.shared_text()),
        ];
        self.write_record(
            namespace,
            control::CENSUS_NAME,
            &annotations,
            holder,
            counted_at,
        )
        .await
    }

    async fn kill_switch(&self, namespace: &str) -> Result<KillSwitch, ClusterError> {
        let api: Api<ConfigMap> = Api::namespaced(self.client.clone(), namespace);
        let found = retrying("get configmap", || api.get_opt(control::OBJECT_NAME))
            .await
            .map_err(|source| ClusterError::KillSwitch {
                namespace: namespace.into(),
                source,
            })?;
        let value = found
            .as_ref()
            .and_then(|cm| cm.data.as_ref())
            .and_then(|d| d.get(control::KILL_SWITCH_KEY))
            .map(String::as_str);
        Ok(KillSwitch::from_value(value))
    }

    async fn acquire_lease(
        &self,
        namespace: &str,
        holder: &str,
        until: Option<Instant>,
    ) -> Result<LeaseTaken, ClusterError> {
        let api: Api<Lease> = Api::namespaced(self.client.clone(), namespace);
        let failed = |source| ClusterError::Lease {
            namespace: namespace.into(),
            source,
        };
        let own = Instant::now() + control::LEASE_WAIT;
        let deadline = until.map_or(own, |until| own.min(until));
        let mut waited = false;
        loop {
            // The time written into the Lease, and the same moment on this
            // clock: the Lease's duration runs from here.
            let now = k8s_openapi::jiff::Timestamp::now();
            let stamped = Instant::now();
            let found = retrying("get lease", || api.get_opt(control::OBJECT_NAME))
                .await
                .map_err(failed)?;
            let written = match take(&api, namespace, found, holder, now).await {
                Attempt::Written(written) => *written,
                Attempt::Held { by, pause } => {
                    if Instant::now() + pause > deadline {
                        return Err(ClusterError::LeaseBusy { holder: by });
                    }
                    waited = true;
                    tokio::time::sleep(pause).await;
                    continue;
                }
            };
            match written {
                Ok(lease) => {
                    if let Ok(mut held) = self.held.lock() {
                        *held = Some(lease);
                    }
                    return Ok(LeaseTaken { waited, stamped });
                }
                Err(kube::Error::Api(status))
                    if status.is_conflict() || status.is_already_exists() =>
                {
                    if Instant::now() > deadline {
                        return Err(ClusterError::LeaseBusy {
                            holder: "another invocation".into(),
                        });
                    }
                    waited = true;
                }
                // Transient failures were retried, bounded, by `retrying`.
                Err(e) => return Err(failed(e)),
            }
        }
    }

    async fn release_lease(&self, namespace: &str, holder: &str) -> Result<(), ClusterError> {
        let api: Api<Lease> = Api::namespaced(self.client.clone(), namespace);
        let failed = |source| ClusterError::Lease {
            namespace: namespace.into(),
            source,
        };
        // Released: the Lease as last written is no longer ours to keep.
        let mut found = self
            .last_written(&api, namespace, true)
            .await
            .map_err(failed)?;
        let params = PostParams::default();
        // Twice at most: a conflict comes from a write of ours that moved the
        // resourceVersion (a renewal, or a release whose answer was lost),
        // read back as still ours, or from a taker after expiry: not ours.
        for _ in 0..2 {
            let Some(mut lease) = found.filter(|l| held_by_holder(l, holder)) else {
                return Ok(());
            };
            if let Some(spec) = lease.spec.as_mut() {
                spec.holder_identity = None;
            }
            match retrying("release lease", || {
                api.replace(control::OBJECT_NAME, &params, &lease)
            })
            .await
            {
                Ok(_) => return Ok(()),
                Err(kube::Error::Api(status)) if status.is_conflict() => {
                    found = retrying("get lease", || api.get_opt(control::OBJECT_NAME))
                        .await
                        .map_err(failed)?;
                }
                Err(e) => return Err(failed(e)),
            }
        }
        // Still ours after two tries: it expires on its own.
        Ok(())
    }

    async fn renew_lease(&self, namespace: &str, holder: &str) -> Result<bool, ClusterError> {
        let api: Api<Lease> = Api::namespaced(self.client.clone(), namespace);
        let failed = |source| ClusterError::Lease {
            namespace: namespace.into(),
            source,
        };
        let found = self
            .last_written(&api, namespace, false)
            .await
            .map_err(failed)?;
        let Some(mut lease) = found else {
            return Ok(false);
        };
        let params = PostParams::default();
        // Twice at most: a conflict after our own renewal whose answer was
        // lost reads back as still ours.
        for _ in 0..2 {
            if !held_by_holder(&lease, holder) {
                return Ok(false);
            }
            if let Some(spec) = lease.spec.as_mut() {
                spec.renew_time = Some(MicroTime(k8s_openapi::jiff::Timestamp::now()));
            }
            match retrying("renew lease", || {
                api.replace(control::OBJECT_NAME, &params, &lease)
            })
            .await
            {
                Ok(renewed) => {
                    if let Ok(mut held) = self.held.lock() {
                        *held = Some(renewed);
                    }
                    return Ok(true);
                }
                Err(kube::Error::Api(status)) if status.is_conflict() => {
                    match retrying("get lease", || api.get_opt(control::OBJECT_NAME))
                        .await
                        .map_err(failed)?
                    {
                        Some(fresh) => lease = fresh,
                        None => return Ok(false),
                    }
                }
                Err(e) => return Err(failed(e)),
            }
        }
        Ok(false)
    }
}

impl Kube {
    /// The Lease as this handle last wrote it (taken out of the cache when
    /// `take`), else as read now: its resourceVersion guards the next write
    /// as well as a fresh read would.
    async fn last_written(
        &self,
        api: &Api<Lease>,
        namespace: &str,
        take: bool,
    ) -> Result<Option<Lease>, kube::Error> {
        let kept = self
            .held
            .lock()
            .ok()
            .and_then(|mut held| if take { held.take() } else { held.clone() })
            .filter(|l| l.metadata.namespace.as_deref() == Some(namespace));
        match kept {
            Some(lease) => Ok(Some(lease)),
            None => retrying("get lease", || api.get_opt(control::OBJECT_NAME)).await,
        }
    }
}

/// One try at the fencing Lease.
enum Attempt {
    /// Written (or the write failed): the Lease as the apiserver answered.
    Written(Box<Result<Lease, kube::Error>>),
    /// Another invocation holds it: look again after `pause`.
    Held { by: String, pause: Duration },
}

/// Takes the Lease `found` (or creates it) for `holder` when
/// [`control::lease_step`] allows, guarded by the resourceVersion read.
async fn take(
    api: &Api<Lease>,
    namespace: &str,
    found: Option<Lease>,
    holder: &str,
    now: k8s_openapi::jiff::Timestamp,
) -> Attempt {
    let params = PostParams::default();
    let Some(mut lease) = found else {
        let lease = Lease {
            metadata: ObjectMeta {
                name: Some(control::OBJECT_NAME.into()),
                namespace: Some(namespace.into()),
                ..ObjectMeta::default()
            },
            spec: Some(held_by(holder, now)),
        };
        // Retried like every call; a lost answer makes the repeat meet
        // AlreadyExists, and the next look finds the Lease held by us, which
        // `lease_step` accepts.
        return Attempt::Written(Box::new(
            retrying("create lease", || api.create(&params, &lease)).await,
        ));
    };
    let spec = lease.spec.clone().unwrap_or_default();
    let facts = LeaseFacts {
        renewed: spec
            .renew_time
            .or(spec.acquire_time)
            .map(|t| t.0.as_second()),
        holder: spec.holder_identity,
        duration_secs: spec.lease_duration_seconds,
    };
    match control::lease_step(&facts, holder, now.as_second()) {
        LeaseStep::Take => {
            lease.spec = Some(held_by(holder, now));
            // Carries the resourceVersion read: two takers cannot both win.
            let replaced = retrying("replace lease", || {
                api.replace(control::OBJECT_NAME, &params, &lease)
            })
            .await;
            Attempt::Written(Box::new(replaced))
        }
        LeaseStep::Wait(pause) => Attempt::Held {
            by: facts.holder.unwrap_or_default(),
            pause,
        },
    }
}

/// The census a Lease carries: its count, and its `renewTime` as the time
/// of the count.
fn census_of(lease: &Lease) -> Option<Census> {
    let others = lease
        .metadata
        .annotations
        .as_ref()?
        .get(control::CENSUS_OTHERS)?
        .parse()
        .ok()?;
    let counted_at = lease.spec.as_ref()?.renew_time.as_ref()?.0.as_second();
    let shared = lease
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(control::CENSUS_SHARED))
        .map(|text| Census::parse_shared(text))
        .unwrap_or_default();
    Some(Census {
        others,
        counted_at,
        shared,
    })
}

impl Kube {
    /// What the last witness round left in the witness Lease in
    /// `namespace` ([`control::WITNESS_NAME`]); `None` before the first.
    pub async fn read_witness_record(
        &self,
        namespace: &str,
    ) -> Result<Option<String>, ClusterError> {
        self.witness_annotation(namespace, control::WITNESS_FAILING)
            .await
    }

    /// The annotation `key` of the witness Lease in `namespace`.
    async fn witness_annotation(
        &self,
        namespace: &str,
        key: &str,
    ) -> Result<Option<String>, ClusterError> {
        let api: Api<Lease> = Api::namespaced(self.client.clone(), namespace);
        let found = retrying("get witness record", || api.get_opt(control::WITNESS_NAME))
            .await
            .map_err(|source| ClusterError::Lease {
                namespace: namespace.into(),
                source,
            })?;
        Ok(found
            .and_then(|lease| lease.metadata.annotations)
            .and_then(|mut a| a.remove(key)))
    }

    /// The census of the inventory's UUIDs an earlier process left on the
    /// witness Lease in `namespace` ([`control::SYSTEM_UUIDS`]).
    pub async fn read_system_uuids(&self, namespace: &str) -> Result<Option<String>, ClusterError> {
        self.witness_annotation(namespace, control::SYSTEM_UUIDS)
            .await
    }

    /// Leaves the census `text` on the witness Lease in `namespace`, as
    /// `holder`.
    pub async fn write_system_uuids(
        &self,
        namespace: &str,
        text: &str,
        holder: &str,
    ) -> Result<(), ClusterError> {
        self.write_witness_annotation(namespace, (control::SYSTEM_UUIDS, text), holder)
            .await
    }

    /// Leaves `record` in the witness Lease in `namespace`, as `holder`.
    pub async fn write_witness_record(
        &self,
        namespace: &str,
        record: &str,
        holder: &str,
    ) -> Result<(), ClusterError> {
        self.write_witness_annotation(namespace, (control::WITNESS_FAILING, record), holder)
            .await
    }

    /// Leaves the annotation `key: text` on the witness Lease in
    /// `namespace`, as `holder`; its other annotations stay.
    async fn write_witness_annotation(
        &self,
        namespace: &str,
        (key, text): (&str, &str),
        holder: &str,
    ) -> Result<(), ClusterError> {
        let annotations = [(key, text.to_owned())];
        let now = k8s_openapi::jiff::Timestamp::now();
        self.write_record(namespace, control::WITNESS_NAME, &annotations, holder, now)
            .await
    }

    /// Leaves `annotations` on the Lease `name` in `namespace`, renewed at
    /// `at` by `holder`: a record nobody holds (the census, the witness's),
    /// created by the first writer.
    async fn write_record(
        &self,
        namespace: &str,
        name: &str,
        annotations: &[(&str, String)],
        holder: &str,
        at: k8s_openapi::jiff::Timestamp,
    ) -> Result<(), ClusterError> {
        let api: Api<Lease> = Api::namespaced(self.client.clone(), namespace);
        let failed = |source| ClusterError::Lease {
            namespace: namespace.into(),
            source,
        };
        let fill = |lease: &mut Lease| {
            lease
                .metadata
                .annotations
                .get_or_insert_with(Default::default)
                .extend(
                    annotations
                        .iter()
                        .map(|(k, v)| ((*k).to_owned(), v.clone())),
                );
            lease.spec = Some(LeaseSpec {
                holder_identity: Some(holder.into()),
                renew_time: Some(MicroTime(at)),
                ..LeaseSpec::default()
            });
        };
        let params = PostParams::default();
        // A writer that meets another's write (a conflict, or a create that
        // finds the object) reads once more and writes its newer record.
        for _ in 0..2 {
            let found = retrying("get record", || api.get_opt(name))
                .await
                .map_err(failed)?;
            let written = match found {
                Some(mut lease) => {
                    fill(&mut lease);
                    retrying("replace record", || api.replace(name, &params, &lease)).await
                }
                None => {
                    let mut lease = Lease {
                        metadata: ObjectMeta {
                            name: Some(name.into()),
                            namespace: Some(namespace.into()),
                            ..ObjectMeta::default()
                        },
                        spec: None,
                    };
                    fill(&mut lease);
                    retrying("create record", || api.create(&params, &lease)).await
                }
            };
            match written {
                Ok(_) => return Ok(()),
                Err(kube::Error::Api(status)) if status.code == 409 => continue,
                Err(e) => return Err(failed(e)),
            }
        }
        // Two writers kept writing at once: the other's record, as recent
        // as this one, stands.
        Ok(())
    }
}

fn held_by_holder(lease: &Lease, holder: &str) -> bool {
    lease
        .spec
        .as_ref()
        .and_then(|s| s.holder_identity.as_deref())
        == Some(holder)
}

fn held_by(holder: &str, now: k8s_openapi::jiff::Timestamp) -> LeaseSpec {
    LeaseSpec {
        holder_identity: Some(holder.into()),
        lease_duration_seconds: Some(control::LEASE_SECONDS),
        acquire_time: Some(MicroTime(now)),
        renew_time: Some(MicroTime(now)),
        ..LeaseSpec::default()
    }
}
