//! Where the notifications go: `NOTIFY_TOPIC`, an SNS topic's ARN or a
//! Pub/Sub topic's name, told apart by their shape.

use super::variables::ConfigError;
use crate::core::outbound::metrics::Dependency;

/// A topic to publish each notification to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Topic {
    /// An SNS topic (standard, not FIFO), by ARN.
    Sns {
        /// `arn:aws:sns:REGION:ACCOUNT:NAME`.
        arn: String,
    },
    /// A Pub/Sub topic, by its full name.
    PubSub {
        /// `projects/PROJECT/topics/TOPIC`.
        name: String,
    },
}

impl Topic {
    /// An SNS topic's region, which its publish must be sent to whatever
    /// region the function runs in.
    pub fn sns_region(&self) -> Option<&str> {
        match self {
            Self::Sns { arn } => arn.split(':').nth(3),
            Self::PubSub { .. } => None,
        }
    }

    /// The service a failure to publish to it is counted under.
    pub fn dependency(&self) -> Dependency {
        match self {
            Self::Sns { .. } => Dependency::Sns,
            Self::PubSub { .. } => Dependency::PubSub,
        }
    }

    /// The topic's ARN or name.
    pub fn id(&self) -> &str {
        match self {
            Self::Sns { arn } => arn,
            Self::PubSub { name } => name,
        }
    }
}

/// The notification settings.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Notify {
    /// The topic.
    pub topic: Topic,
    /// Another Pub/Sub API base URL than Google's (`PUBSUB_ENDPOINT`): a
    /// plain http:// one is a local stand-in and gets no credentials.
    pub pubsub_endpoint: Option<String>,
    /// The cluster's name in each message (EKS's `CLUSTER_NAME`, the name
    /// in `CLUSTER_TAG`, or `GKE_CLUSTER`'s last part), when known.
    pub cluster: Option<String>,
}

const EXPECTED: &str = "an SNS topic ARN (arn:aws:sns:REGION:ACCOUNT:NAME, a standard topic) or a Pub/Sub topic (projects/PROJECT/topics/TOPIC)";

/// The settings, or `None` when `NOTIFY_TOPIC` is unset.
pub(super) fn notify(get: &impl Fn(&str) -> Option<String>) -> Result<Option<Notify>, ConfigError> {
    let endpoint = get("PUBSUB_ENDPOINT");
    if let Some(url) = &endpoint
        && !(url.starts_with("https://") || url.starts_with("http://"))
    {
        return Err(ConfigError::Invalid {
            var: "PUBSUB_ENDPOINT",
            value: url.clone(),
            expected: "an http:// or https:// URL",
        });
    }
    let Some(raw) = get("NOTIFY_TOPIC") else {
        return Ok(None);
    };
    let topic = parse(&raw).map_err(|why| ConfigError::Malformed {
        var: "NOTIFY_TOPIC",
        value: raw.clone(),
        why,
    })?;
    Ok(Some(Notify {
        topic,
        pubsub_endpoint: endpoint,
        cluster: None,
    }))
}

/// Parses a topic, strictly: a typo is refused at start, not found at the
/// first fencing.
pub fn parse(raw: &str) -> Result<Topic, String> {
    if raw.starts_with("arn:") {
        return sns(raw).map(|()| Topic::Sns {
            arn: raw.to_owned(),
        });
    }
    if raw.starts_with("projects/") {
        return pubsub(raw).map(|()| Topic::PubSub {
            name: raw.to_owned(),
        });
    }
    Err(format!("expected {EXPECTED}"))
}

fn sns(raw: &str) -> Result<(), String> {
    let parts: Vec<&str> = raw.split(':').collect();
    let [_, partition, service, region, account, name] = parts.as_slice() else {
        return Err(format!("expected {EXPECTED}"));
    };
    if !partition.starts_with("aws") || *service != "sns" {
        return Err("not an SNS topic ARN (arn:aws:sns:...)".into());
    }
    let region_ok = !region.is_empty()
        && region
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
    if !region_ok {
        return Err(format!("{region:?} is not a region"));
    }
    if account.len() != 12 || !account.bytes().all(|b| b.is_ascii_digit()) {
        return Err(format!("{account:?} is not a 12-digit account id"));
    }
    if name.ends_with(".fifo") {
        return Err("a FIFO topic needs a message group per message: use a standard topic".into());
    }
    let name_ok = (1..=256).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
    if !name_ok {
        return Err(format!(
            "{name:?} is not a topic name (1 to 256 letters, digits, - and _)"
        ));
    }
    Ok(())
}

fn pubsub(raw: &str) -> Result<(), String> {
    let parts: Vec<&str> = raw.split('/').collect();
    let ["projects", project, "topics", topic] = parts.as_slice() else {
        return Err(format!("expected {EXPECTED}"));
    };
    // Domain-scoped projects (example.com:project) keep their colon.
    let project_ok = !project.is_empty()
        && project
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"-.:".contains(&b));
    if !project_ok {
        return Err(format!("{project:?} is not a project id"));
    }
    let topic_ok = (3..=255).contains(&topic.len())
        && topic.starts_with(|c: char| c.is_ascii_alphabetic())
        && !topic.starts_with("goog")
        && topic
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_.~+%".contains(&b));
    if !topic_ok {
        return Err(format!(
            "{topic:?} is not a topic name (3 to 255 characters, a letter first, letters, digits and - _ . ~ + %, not goog...)"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lookup<'a>(vars: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |k| {
            vars.iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| (*v).to_owned())
        }
    }

    #[test]
    fn either_cloud_s_topic_is_told_by_its_shape() {
        assert_eq!(
            parse("arn:aws:sns:eu-west-1:123456789012:node-fencer"),
            Ok(Topic::Sns {
                arn: "arn:aws:sns:eu-west-1:123456789012:node-fencer".into()
            })
        );
        assert_eq!(
            parse("arn:aws-us-gov:sns:us-gov-west-1:123456789012:a_b").map(|t| t.id().to_owned()),
            Ok("arn:aws-us-gov:sns:us-gov-west-1:123456789012:a_b".into())
        );
        let central = parse("arn:aws:sns:us-east-1:123456789012:alerts").expect("a topic");
        assert_eq!(central.sns_region(), Some("us-east-1"));
        assert_eq!(
            parse("projects/my-proj/topics/node-fencer"),
            Ok(Topic::PubSub {
                name: "projects/my-proj/topics/node-fencer".into()
            })
        );
    }

    #[test]
    fn a_topic_that_cannot_be_published_to_is_refused_with_its_reason() {
        for (raw, says) in [
            ("node-fencer", "expected an SNS topic ARN"),
            (
                "arn:aws:sqs:eu-west-1:123456789012:q",
                "not an SNS topic ARN",
            ),
            ("arn:aws:sns:eu-west-1:1234:t", "12-digit account id"),
            (
                "arn:aws:sns:eu-west-1:123456789012:t.fifo",
                "standard topic",
            ),
            ("arn:aws:sns:eu-west-1:123456789012:a b", "not a topic name"),
            (
                "arn:aws:sns:eu-west-1:123456789012",
                "expected an SNS topic ARN",
            ),
            ("projects/p/topics/goog-x", "not a topic name"),
            ("projects/p/topics/ab", "not a topic name"),
            ("projects/P Q/topics/abc", "not a project id"),
            ("projects/p/subscriptions/abc", "expected an SNS topic ARN"),
        ] {
            let e = parse(raw).expect_err(raw);
            assert!(e.contains(says), "{raw}: {e}");
        }
    }

    #[test]
    fn unset_is_off_and_a_bad_endpoint_is_named() {
        assert_eq!(notify(&lookup(&[])), Ok(None));
        let set = [
            ("NOTIFY_TOPIC", "projects/p/topics/abc"),
            ("PUBSUB_ENDPOINT", "http://127.0.0.1:1"),
        ];
        assert_eq!(
            notify(&lookup(&set)).map(|n| n.and_then(|n| n.pubsub_endpoint)),
            Ok(Some("http://127.0.0.1:1".into()))
        );
        let bad = [("PUBSUB_ENDPOINT", "127.0.0.1:1")];
        assert!(matches!(
            notify(&lookup(&bad)),
            Err(ConfigError::Invalid {
                var: "PUBSUB_ENDPOINT",
                ..
            })
        ));
        let bad = [("NOTIFY_TOPIC", "topic")];
        assert!(matches!(
            notify(&lookup(&bad)),
            Err(ConfigError::Malformed {
                var: "NOTIFY_TOPIC",
                ..
            })
        ));
    }
}
