//! What the cloud said of each machine during one invocation. A machine is
//! asked about once for the decision ([`Looks::first`]: the screen's answer
//! serves the decision, the decision's the recovery check); every look that
//! must be fresh (right before the taint, right before a node's detaches,
//! while a powered-off machine stops, after the settle delay) is an explicit
//! [`Looks::again`], so the second and third looks are visible calls. An
//! error makes every answer of the call that failed a failed lookup, which
//! the core never takes for "off"; a provider that asks machine by machine
//! (a BMC each) fails only the machine it could not ask.
//!
//! Every look after the first is held to the machine the first one
//! described ([`InstanceFacts::same_machine`]): a VM recreated under the
//! same name, or another System behind the same BMC name, is another
//! machine, and its answer is "not found" for the rest of the invocation.

use std::collections::HashMap;
use std::net::IpAddr;
use std::time::Instant;

use tracing::warn;

use crate::core::model::facts::{Confirmation, InstanceFacts, NodeFacts};
use crate::core::model::instance::InstanceId;
use crate::core::outbound::metrics::Stage;
use crate::core::rules::plan;
use crate::pipeline::ctx::Ctx;
use crate::shell::cloud::CloudError;

/// The answers of one invocation, by machine.
#[derive(Clone, Debug, Default)]
pub(crate) struct Looks {
    answers: HashMap<InstanceId, Confirmation>,
    /// The machine the first look that described each name found: what
    /// every later look is held to.
    judged: HashMap<InstanceId, InstanceFacts>,
    /// The names under which a later look found another machine.
    replaced: Vec<InstanceId>,
    /// The machines found carrying each Node name asked about.
    named: HashMap<String, Vec<InstanceFacts>>,
    /// The machines found holding each set of addresses asked about.
    holding: HashMap<Vec<IpAddr>, Vec<InstanceFacts>>,
}

impl Looks {
    /// Every answer so far.
    pub(crate) fn answers(&self) -> &HashMap<InstanceId, Confirmation> {
        &self.answers
    }

    /// The answer for `id`, if it was asked about.
    pub(crate) fn get(&self, id: &InstanceId) -> Option<&Confirmation> {
        self.answers.get(id)
    }

    /// Asks the cloud, in one batched call, about those of `ids` it was not
    /// asked about yet in this invocation.
    pub(crate) async fn first(&mut self, ctx: &Ctx<'_>, ids: &[InstanceId]) {
        let new: Vec<InstanceId> = ids
            .iter()
            .filter(|id| !self.answers.contains_key(*id))
            .cloned()
            .collect();
        let answers = ask(ctx, &new).await;
        let answers = self.hold(answers);
        self.answers.extend(answers);
    }

    /// Asks the cloud about `ids` again, whatever it said before: this
    /// look's answers, which also replace the earlier ones.
    pub(crate) async fn again(
        &mut self,
        ctx: &Ctx<'_>,
        ids: &[InstanceId],
    ) -> HashMap<InstanceId, Confirmation> {
        let answers = self.hold(ask(ctx, ids).await);
        self.answers
            .extend(answers.iter().map(|(k, v)| (k.clone(), v.clone())));
        answers
    }

    /// The machines that carry the Node name `name` and may run, in `vpc`
    /// when given ([`Cloud::machines_named`]): asked once per invocation; a
    /// failed question is not kept, so the next one asks again.
    pub(crate) async fn named(
        &mut self,
        ctx: &Ctx<'_>,
        name: &str,
        vpc: Option<&str>,
    ) -> Result<&[InstanceFacts], CloudError> {
        // Not a look at the Node's machine: no sample of the confirmation's
        // latency, only its errors counted.
        if !self.named.contains_key(name) {
            let found = ctx.cloud.machines_named(name, vpc).await;
            let found = found.inspect_err(|e| ctx.meter.error(e.dependency()))?;
            self.named.insert(name.to_owned(), found);
        }
        Ok(self.named.get(name).map_or(&[], Vec::as_slice))
    }

    /// The machines that hold one of `addresses` and may run, in `vpc` when
    /// given ([`Cloud::machines_holding`]): asked once per invocation; a
    /// failed question is not kept, so the next one asks again.
    pub(crate) async fn holding(
        &mut self,
        ctx: &Ctx<'_>,
        addresses: &[IpAddr],
        vpc: Option<&str>,
    ) -> Result<&[InstanceFacts], CloudError> {
        if !self.holding.contains_key(addresses) {
            let found = ctx.cloud.machines_holding(addresses, vpc).await;
            let found = found.inspect_err(|e| ctx.meter.error(e.dependency()))?;
            self.holding.insert(addresses.to_vec(), found);
        }
        Ok(self.holding.get(addresses).map_or(&[], Vec::as_slice))
    }

    /// The machine the first look at `id` described, if one did.
    pub(crate) fn judged(&self, id: &InstanceId) -> Option<&InstanceFacts> {
        self.judged.get(id)
    }

    /// True when a later look at `id` found another machine than the first.
    pub(crate) fn replaced(&self, id: &InstanceId) -> bool {
        self.replaced.contains(id)
    }

    /// Holds each answer to the machine first described under its name,
    /// and records the first description of a name not described before.
    fn hold(
        &mut self,
        answers: HashMap<InstanceId, Confirmation>,
    ) -> HashMap<InstanceId, Confirmation> {
        answers
            .into_iter()
            .map(|(id, answer)| {
                let held = match self.judged.get(&id) {
                    Some(first) => {
                        let held = first.same_machine(&answer);
                        if held != answer && !self.replaced.contains(&id) {
                            warn!(machine = %id, "another machine under the name judged: taken for not found");
                            self.replaced.push(id.clone());
                        }
                        held
                    }
                    None => {
                        if let Confirmation::Seen(facts) = &answer {
                            self.judged.insert(id.clone(), facts.clone());
                        }
                        answer
                    }
                };
                (id, held)
            })
            .collect()
    }

    /// What the cloud is taken to have said of `id`, for a stage test that
    /// starts after the first look.
    #[cfg(test)]
    pub(crate) fn seed(&mut self, id: InstanceId, answer: Confirmation) {
        if let Confirmation::Seen(facts) = &answer {
            self.judged
                .entry(id.clone())
                .or_insert_with(|| facts.clone());
        }
        self.answers.insert(id, answer);
    }

    /// Takes back what was described under a Node's machine name when it is
    /// known to be another machine ([`plan::disown_replaced`]).
    pub(crate) fn disown_replaced(&mut self, nodes: &[NodeFacts]) {
        plan::disown_replaced(nodes, &mut self.answers);
    }
}

/// The cloud's answer for each of `ids`; an id it does not know is
/// [`Confirmation::NotFound`], an id whose call failed a failed lookup. A
/// look of its own, kept nowhere: one node's last look right before its own
/// detaches, while other nodes are worked on.
pub(crate) async fn ask(ctx: &Ctx<'_>, ids: &[InstanceId]) -> HashMap<InstanceId, Confirmation> {
    if ids.is_empty() {
        return HashMap::new();
    }
    let started = Instant::now();
    let described = ctx.cloud.describe_each(ids).await;
    ctx.meter.stage(Stage::Confirm, started.elapsed());
    let mut map: HashMap<InstanceId, Confirmation> = ids
        .iter()
        .map(|id| (id.clone(), Confirmation::NotFound))
        .collect();
    for facts in described.found {
        if map.contains_key(&facts.id) {
            map.insert(facts.id.clone(), Confirmation::Seen(facts));
        }
    }
    for (failed, e) in described.failed {
        ctx.meter.error(e.dependency());
        warn!(error = %e, machines = ?failed, "could not confirm these machines' states; they will not be fenced");
        for id in failed {
            let error = e.to_string();
            map.insert(id, Confirmation::LookupFailed { error });
        }
    }
    map
}
