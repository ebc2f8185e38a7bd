# The fencing policy both platforms share: validated once there, rendered as
# the environment the binary reads (infra/modules/settings).
module "settings" {
  source = "../settings"

  dry_run                       = var.dry_run
  fast_not_ready                = var.fast_not_ready
  out_of_service_no_schedule    = var.out_of_service_no_schedule
  max_out_of_service            = var.max_out_of_service
  max_out_of_service_percent    = var.max_out_of_service_percent
  node_selector                 = var.node_selector
  fencing_mode                  = var.fencing_mode
  control_namespace             = var.control_namespace
  confirm_again_after_seconds   = var.confirm_again_after_seconds
  volume_detach_timeout_seconds = var.volume_detach_timeout_seconds
  not_ready_wait_seconds        = var.not_ready_wait_seconds
  recovery_settle_seconds       = var.recovery_settle_seconds
  recovery                      = var.recovery
  log_format                    = var.log_format
  log_level                     = var.log_level
}

data "aws_caller_identity" "current" {}

data "aws_partition" "current" {}

data "aws_region" "current" {}

locals {
  # Active fencing: "stuck" or "on" (true and false, as the variable once
  # was, are "on" and "off"); the code takes "stuck" and "on".
  active_fencing       = contains(["stuck", "on", "true"], var.active_fencing)
  active_fencing_scope = var.active_fencing == "stuck" ? "stuck" : "on"

  account_id = data.aws_caller_identity.current.account_id
  partition  = data.aws_partition.current.partition
  region     = data.aws_region.current.region

  eks_mode = var.cluster_name != null
  # With the endpoint and CA given, the function never calls eks:DescribeCluster.
  describe_cluster = local.eks_mode && (var.cluster_endpoint == null || var.cluster_ca_data == null)

  # How long an invocation waits for another one to release the fencing Lease
  # before it gives up (LEASE_WAIT in handler/src/core/rules/control.rs).
  lease_wait_seconds = 30

  # The worst case of one invocation, wait by wait: a Node still Ready although
  # its instance is off, the Lease, the second EC2 confirmation, the detach
  # wait of several nodes (twice it), a requested recovery's settle delay, and
  # with active fencing the wait for a powered-off instance to stop, plus 30 s
  # for the Kubernetes and EC2 calls around them. The variables' upper bounds
  # (120, 120, 180, 120, and 120 for the power-off) keep it within Lambda's
  # 900 s.
  function_timeout = var.not_ready_wait_seconds + local.lease_wait_seconds + var.confirm_again_after_seconds + var.volume_detach_timeout_seconds * 2 + var.recovery_settle_seconds + local.power_off_wait_seconds + 30

  # Without active fencing the function never powers off, so never waits for it.
  power_off_wait_seconds = local.active_fencing ? var.power_off_wait_seconds : 0

  # Active fencing: the tag an instance must carry for the role to stop it.
  # EKS managed node groups, Karpenter and self-managed EKS nodes tag their
  # instances kubernetes.io/cluster/<name> = owned; a self-managed cluster
  # names its own tag (a precondition of the api policy requires one).
  power_off_instance_tag = var.power_off_instance_tag != null ? var.power_off_instance_tag : (
    local.eks_mode ? { key = "kubernetes.io/cluster/${var.cluster_name}", value = "owned" } : null
  )

  # Active fencing without power_off_control_plane: the role may not stop an
  # instance tagged as control plane (see the api policy's Deny statements).
  deny_control_plane_stop = local.active_fencing && !var.power_off_control_plane

  # The tag a volume must carry for the role to detach it: this cluster's
  # own, as the EBS CSI driver writes it with --k8s-tag-cluster-id, or the
  # one given (by default the driver's tag of every cluster's volumes).
  detach_volume_tag = var.detach_volume_cluster_id != null ? { key = "kubernetes.io/cluster/${var.detach_volume_cluster_id}", value = "owned" } : {
    key   = var.detach_volume_tag_key
    value = var.detach_volume_tag_value
  }

  # EC2 states the function acts on: stopped and terminated to fence; running to
  # end a fencing, once the node is Ready again and has settled.
  instance_states = ["stopped", "terminated", "running"]

  event_pattern = {
    source      = ["aws.ec2"]
    detail-type = ["EC2 Instance State-change Notification"]
    # EventBridge cannot match on instance tags here: the event carries only
    # instance-id and state. Non-nodes are ignored by the function.
    detail = merge(
      { state = local.instance_states },
      length(var.instance_ids) > 0 ? { "instance-id" = var.instance_ids } : {},
    )
  }

  webhook_token_in_secretsmanager = var.enable_alertmanager_url && var.webhook_token_store == "secretsmanager"
  webhook_token_in_ssm            = var.enable_alertmanager_url && var.webhook_token_store == "ssm"

  # Secrets Manager secrets the function reads (kubeconfig, webhook token).
  secret_arns = concat(
    var.kubeconfig_secret_arn != null ? [var.kubeconfig_secret_arn] : [],
    aws_secretsmanager_secret.webhook_token[*].arn,
  )

  # SSM parameters the function reads. A parameter ARN is the name without its
  # leading slash after "parameter/".
  ssm_parameter_arns = concat(
    var.kubeconfig_ssm_parameter_name != null ? ["arn:${local.partition}:ssm:${local.region}:${local.account_id}:parameter/${trimprefix(var.kubeconfig_ssm_parameter_name, "/")}"] : [],
    aws_ssm_parameter.webhook_token[*].arn,
  )

  environment = merge(
    module.settings.environment,
    { FENCE_HIBERNATED = tostring(var.fence_hibernated) },
    var.cluster_vpc_id != null ? { CLUSTER_VPC_ID = var.cluster_vpc_id } : {},
    var.cluster_vpc_id != null && var.cluster_tag != null ? { CLUSTER_TAG = var.cluster_tag } : {},
    local.eks_mode ? { CLUSTER_NAME = var.cluster_name } : {},
    local.eks_mode && !local.describe_cluster ? { CLUSTER_ENDPOINT = var.cluster_endpoint, CLUSTER_CA_DATA = var.cluster_ca_data } : {},
    var.kubeconfig_ssm_parameter_name != null ? { KUBECONFIG_SSM_PARAMETER = var.kubeconfig_ssm_parameter_name } : {},
    var.kubeconfig_secret_arn != null ? { KUBECONFIG_SECRET_ID = var.kubeconfig_secret_arn } : {},
    local.webhook_token_in_secretsmanager ? { WEBHOOK_TOKEN_SECRET_ID = aws_secretsmanager_secret.webhook_token[0].arn } : {},
    local.webhook_token_in_ssm ? { WEBHOOK_TOKEN_SSM_PARAMETER = aws_ssm_parameter.webhook_token[0].name } : {},
    # The code refuses the power-off settings without ACTIVE_FENCING=stuck or
    # on: all four, or none.
    local.active_fencing ? {
      ACTIVE_FENCING          = local.active_fencing_scope
      POWER_OFF_AFTER_SECONDS = tostring(var.power_off_after_seconds)
      POWER_OFF_WAIT_SECONDS  = tostring(var.power_off_wait_seconds)
      PARTITION_PERCENT       = tostring(var.partition_percent)
    } : {},
    # Unset is false: passed only to allow it.
    local.active_fencing && var.power_off_control_plane ? { POWER_OFF_CONTROL_PLANE = "true" } : {},
    local.notify ? { NOTIFY_TOPIC = local.notification_topic_arn } : {},
  )

  alarm_actions = var.alarm_sns_topic_arn != null ? [var.alarm_sns_topic_arn] : []

  # The topic the notifications go to: the one given, the one created, or
  # none. The created topic's ARN is spelt out, so that the plan shows it.
  notification_topic_arn = var.create_notification_topic ? "arn:${local.partition}:sns:${local.region}:${local.account_id}:${aws_sns_topic.notifications[0].name}" : var.notification_topic_arn
  notify                 = var.create_notification_topic || var.notification_topic_arn != null

  # The module's Lambda functions: one zip, one role, one environment, so both
  # fence alike. "main" takes the EventBridge events, the recovery schedule and
  # direct invocations. "webhook" (with enable_alertmanager_url) is the only one
  # with a Function URL: that URL is public, and its callers, with the token or
  # without it (401), use up the webhook function's own reserved concurrency,
  # never the main function's, so they cannot delay EventBridge events or the
  # recovery schedule. Both take the same Lease in control_namespace before they
  # write taints, so the out-of-service caps hold across the two functions as
  # across any concurrent invocations.
  webhook_function_name = "${var.name}-webhook"
  all_functions = {
    main = {
      name                           = var.name
      description                    = "Fences dead Kubernetes nodes (out-of-service taint or legacy pod deletion, EBS force-detach) only when EC2 confirms the instance is off, and ends the fencing once the node is back."
      reserved_concurrent_executions = var.reserved_concurrent_executions
    }
    webhook = {
      name                           = local.webhook_function_name
      description                    = "node-fencer behind the Alertmanager Function URL: same code and settings as ${var.name}, with concurrency of its own so that URL callers never hold up ${var.name}."
      reserved_concurrent_executions = var.webhook_reserved_concurrent_executions
    }
  }
  functions = { for key, f in local.all_functions : key => f if key == "main" || var.enable_alertmanager_url }
}

################################################################################
# Lambda functions: main, and webhook (see local.functions)
################################################################################

resource "aws_cloudwatch_log_group" "this" {
  #checkov:skip=CKV_AWS_158:Encryption with a customer key is opt-in through log_kms_key_arn (its key policy must admit CloudWatch Logs); the logs hold decisions and resource ids, no secrets, and are encrypted by CloudWatch Logs regardless.
  #checkov:skip=CKV_AWS_338:Retention is the log_retention_days variable; 30 days by default covers incident review, set 365 or more where a compliance policy asks for it.
  for_each = local.functions

  name              = "/aws/lambda/${each.value.name}"
  retention_in_days = var.log_retention_days
  kms_key_id        = var.log_kms_key_arn
  tags              = var.tags
}

resource "aws_lambda_function" "this" {
  #checkov:skip=CKV_AWS_116:Failed asynchronous invocations of the main function go to the on-failure destination (aws_lambda_function_event_invoke_config.this), which records request and response; a function DLQ as well would deliver every failure twice. The webhook function is only invoked synchronously through its URL: Alertmanager gets the error and retries.
  #checkov:skip=CKV_AWS_117:VPC placement is opt-in through vpc_subnet_ids: the function needs only the AWS APIs and the cluster endpoint, which is public on a default EKS cluster.
  #checkov:skip=CKV_AWS_173:The environment holds no secrets (settings, names and ARNs only: the token and kubeconfig are read from Secrets Manager or SSM), so the AWS managed key suffices.
  #checkov:skip=CKV_AWS_272:Code signing is opt-in through code_signing_config_arn; cargo-lambda builds unsigned zips and signing needs an AWS Signer profile of the deployer's own.
  for_each = local.functions

  # Only the name, description and reserved concurrency differ between the
  # functions; everything else, role included, is the same for both.
  function_name = each.value.name
  description   = each.value.description
  role          = aws_iam_role.this.arn

  filename         = var.package_path
  source_code_hash = filebase64sha256(var.package_path)
  handler          = "bootstrap"
  runtime          = "provided.al2023"
  architectures    = [var.architecture]

  memory_size                    = var.memory_size
  timeout                        = local.function_timeout
  reserved_concurrent_executions = each.value.reserved_concurrent_executions
  code_signing_config_arn        = var.code_signing_config_arn

  environment {
    variables = local.environment
  }

  logging_config {
    log_format = var.log_format == "json" ? "JSON" : "Text"
    log_group  = aws_cloudwatch_log_group.this[each.key].name
  }

  # PassThrough propagates trace headers without sending segments to X-Ray, so
  # the role needs no X-Ray permission.
  tracing_config {
    mode = "PassThrough"
  }

  dynamic "vpc_config" {
    for_each = length(var.vpc_subnet_ids) > 0 ? [true] : []

    content {
      subnet_ids         = var.vpc_subnet_ids
      security_group_ids = var.vpc_security_group_ids
    }
  }

  tags = var.tags

  lifecycle {
    precondition {
      condition     = length(compact([var.cluster_name, var.kubeconfig_ssm_parameter_name, var.kubeconfig_secret_arn])) == 1
      error_message = "Set exactly one of cluster_name (EKS), kubeconfig_ssm_parameter_name or kubeconfig_secret_arn (self-managed)."
    }
    precondition {
      condition     = (var.cluster_endpoint == null) == (var.cluster_ca_data == null) && (var.cluster_endpoint == null || var.cluster_name != null)
      error_message = "cluster_endpoint and cluster_ca_data go together, and only with cluster_name."
    }
    precondition {
      condition     = !(var.create_notification_topic && var.notification_topic_arn != null)
      error_message = "create_notification_topic and notification_topic_arn exclude each other: create a topic, or name one."
    }
    precondition {
      condition     = length(var.notification_emails) == 0 || var.create_notification_topic
      error_message = "notification_emails subscribe to the topic the module creates: set create_notification_topic = true (subscribe to a topic of your own where it is managed)."
    }
    precondition {
      condition     = (length(var.vpc_subnet_ids) == 0) == (length(var.vpc_security_group_ids) == 0)
      error_message = "vpc_subnet_ids and vpc_security_group_ids go together."
    }
  }

  # The role's policy must be in place before the first invocation, and the log
  # group must exist before Lambda would create it without retention.
  depends_on = [aws_iam_role_policy.this, aws_cloudwatch_log_group.this]
}

# The main function and its log group were single resources before the webhook
# function joined them.
moved {
  from = aws_cloudwatch_log_group.this
  to   = aws_cloudwatch_log_group.this["main"]
}

moved {
  from = aws_lambda_function.this
  to   = aws_lambda_function.this["main"]
}

################################################################################
# EKS access: the functions' role becomes the Kubernetes group "node-fencer",
# which infra/kubernetes/rbac.yaml binds to its ClusterRole and Role. Both
# functions run with that one role, so this one entry covers both.
################################################################################

resource "aws_eks_access_entry" "this" {
  count = local.eks_mode && var.eks_access_entry ? 1 : 0

  cluster_name      = var.cluster_name
  principal_arn     = aws_iam_role.this.arn
  kubernetes_groups = ["node-fencer"]
  type              = "STANDARD"
  tags              = var.tags
}

################################################################################
# EventBridge: EC2 instance state changes
################################################################################

resource "aws_cloudwatch_event_rule" "this" {
  name          = "${var.name}-ec2-state"
  description   = "EC2 instance stopped, terminated or running: ${var.name} fences or recovers the node."
  event_pattern = jsonencode(local.event_pattern)
  tags          = var.tags
}

resource "aws_cloudwatch_event_target" "this" {
  rule      = aws_cloudwatch_event_rule.this.name
  target_id = "node-fencer"
  arn       = aws_lambda_function.this["main"].arn

  retry_policy {
    maximum_event_age_in_seconds = var.event_maximum_age_seconds
    maximum_retry_attempts       = var.event_maximum_retry_attempts
  }

  # Events EventBridge could not hand to Lambda at all.
  dead_letter_config {
    arn = aws_sqs_queue.dlq.arn
  }

  depends_on = [aws_sqs_queue_policy.dlq]
}

resource "aws_lambda_permission" "events" {
  statement_id  = "AllowEventBridgeRule"
  action        = "lambda:InvokeFunction"
  function_name = aws_lambda_function.this["main"].function_name
  principal     = "events.amazonaws.com"
  source_arn    = aws_cloudwatch_event_rule.this.arn
}

################################################################################
# EventBridge: the scheduled recovery check
################################################################################

# Every invocation re-checks the nodes the function fenced and ends a fencing
# once its instance runs and the node has been Ready for the settle delay. An
# instance brought back without a running event (or whose node became Ready
# only after the event) would otherwise stay fenced until the next failure.
resource "aws_cloudwatch_event_rule" "recovery" {
  count = var.recovery_schedule != null ? 1 : 0

  name                = "${var.name}-recovery"
  description         = "Periodic sweep: ${var.name} fences NotReady nodes no event named whose instance is off, and ends the fencing of nodes that are back."
  schedule_expression = var.recovery_schedule
  tags                = var.tags
}

resource "aws_cloudwatch_event_target" "recovery" {
  count = var.recovery_schedule != null ? 1 : 0

  rule      = aws_cloudwatch_event_rule.recovery[0].name
  target_id = "node-fencer-recovery"
  arn       = aws_lambda_function.this["main"].arn
  input     = jsonencode({ action = "sweep" })

  retry_policy {
    maximum_event_age_in_seconds = var.event_maximum_age_seconds
    maximum_retry_attempts       = var.event_maximum_retry_attempts
  }

  dead_letter_config {
    arn = aws_sqs_queue.dlq.arn
  }

  depends_on = [aws_sqs_queue_policy.dlq]
}

resource "aws_lambda_permission" "recovery" {
  count = var.recovery_schedule != null ? 1 : 0

  statement_id  = "AllowRecoverySchedule"
  action        = "lambda:InvokeFunction"
  function_name = aws_lambda_function.this["main"].function_name
  principal     = "events.amazonaws.com"
  source_arn    = aws_cloudwatch_event_rule.recovery[0].arn
}

# Events Lambda accepted but the function failed on after its retries, or that
# waited longer than their maximum age (throttled by the reserved concurrency).
resource "aws_lambda_function_event_invoke_config" "this" {
  function_name                = aws_lambda_function.this["main"].function_name
  maximum_event_age_in_seconds = var.async_maximum_event_age_seconds
  maximum_retry_attempts       = var.async_maximum_retry_attempts

  destination_config {
    on_failure {
      destination = aws_sqs_queue.dlq.arn
    }
  }

  # Lambda checks that the role may send to the destination.
  depends_on = [aws_iam_role_policy.this]
}

################################################################################
# Dead-letter queue (EventBridge target DLQ and Lambda on-failure destination)
################################################################################

resource "aws_sqs_queue" "dlq" {
  name                      = "${var.name}-dlq"
  message_retention_seconds = 1209600
  sqs_managed_sse_enabled   = true
  tags                      = var.tags
}

data "aws_iam_policy_document" "dlq" {
  statement {
    sid       = "EventBridgeDeadLetters"
    actions   = ["sqs:SendMessage"]
    resources = [aws_sqs_queue.dlq.arn]

    principals {
      type        = "Service"
      identifiers = ["events.amazonaws.com"]
    }

    condition {
      test     = "ArnEquals"
      variable = "aws:SourceArn"
      values   = concat([aws_cloudwatch_event_rule.this.arn], aws_cloudwatch_event_rule.recovery[*].arn)
    }
  }
}

resource "aws_sqs_queue_policy" "dlq" {
  queue_url = aws_sqs_queue.dlq.id
  policy    = data.aws_iam_policy_document.dlq.json
}

################################################################################
# Alarms
################################################################################

resource "aws_cloudwatch_metric_alarm" "dlq_not_empty" {
  alarm_name          = "${var.name}-dlq-not-empty"
  alarm_description   = "Events for ${var.name} failed or expired and wait in ${aws_sqs_queue.dlq.name}: a node may not have been fenced or recovered. Read the messages, then invoke the function again or delete them (a failed {\"action\":\"recover\"} is repeated by the next scheduled check)."
  namespace           = "AWS/SQS"
  metric_name         = "ApproximateNumberOfMessagesVisible"
  dimensions          = { QueueName = aws_sqs_queue.dlq.name }
  statistic           = "Maximum"
  period              = 300
  evaluation_periods  = 1
  threshold           = 0
  comparison_operator = "GreaterThanThreshold"
  treat_missing_data  = "notBreaching"
  alarm_actions       = local.alarm_actions
  ok_actions          = local.alarm_actions
  tags                = var.tags
}

# One for each function. A refused webhook request (401, 4xx) is an answer, not
# a function error: a flood of them does not set it off.
resource "aws_cloudwatch_metric_alarm" "errors" {
  for_each = local.functions

  alarm_name          = "${each.value.name}-errors"
  alarm_description   = "${each.value.name} returned errors: see its log group ${aws_cloudwatch_log_group.this[each.key].name}."
  namespace           = "AWS/Lambda"
  metric_name         = "Errors"
  dimensions          = { FunctionName = aws_lambda_function.this[each.key].function_name }
  statistic           = "Sum"
  period              = 60
  evaluation_periods  = 1
  threshold           = 0
  comparison_operator = "GreaterThanThreshold"
  treat_missing_data  = "notBreaching"
  alarm_actions       = local.alarm_actions
  ok_actions          = local.alarm_actions
  tags                = var.tags
}

moved {
  from = aws_cloudwatch_metric_alarm.errors
  to   = aws_cloudwatch_metric_alarm.errors["main"]
}

# From node-fencer's own metrics (EMF lines, namespace NodeFencer): every
# metric and dimension set named here is one the code emits, as the manifest
# lists them (tests/infra checks it).

# A refusal at the cap: more Nodes are dead at once than MAX_OUT_OF_SERVICE
# allows, which is a zone outage or worse, and a person should look.
resource "aws_cloudwatch_metric_alarm" "cap_reached" {
  for_each = local.functions

  alarm_name          = "${each.value.name}-cap-reached"
  alarm_description   = "${each.value.name} refused to fence a dead node: more nodes are out of service than max_out_of_service allows. Look at the nodes (node-fencer check), then raise the cap or fence by hand; see the FencingRefused Events."
  namespace           = "NodeFencer"
  metric_name         = "Decisions"
  dimensions          = { Function = each.value.name, Outcome = "skipped", Reason = "cap_reached" }
  statistic           = "Sum"
  period              = 300
  evaluation_periods  = 1
  threshold           = 0
  comparison_operator = "GreaterThanThreshold"
  treat_missing_data  = "notBreaching"
  alarm_actions       = local.alarm_actions
  ok_actions          = local.alarm_actions
  tags                = var.tags
}

# Failed calls to EC2 or Kubernetes in two of three 5-minute windows: retries
# absorb a throttle or a blip, not an outage or a lost permission.
resource "aws_cloudwatch_metric_alarm" "dependency_errors" {
  for_each = local.dependency_alarms

  alarm_name          = "${local.functions[each.value.function].name}-${lower(each.value.dependency)}-errors"
  alarm_description   = "${local.functions[each.value.function].name} keeps failing its calls to ${each.value.dependency}: fencing may be delayed. See its log group and node-fencer preflight."
  namespace           = "NodeFencer"
  metric_name         = "Errors"
  dimensions          = { Function = local.functions[each.value.function].name, Dependency = each.value.dependency }
  statistic           = "Sum"
  period              = 300
  evaluation_periods  = 3
  datapoints_to_alarm = 2
  threshold           = 0
  comparison_operator = "GreaterThanThreshold"
  treat_missing_data  = "notBreaching"
  alarm_actions       = local.alarm_actions
  ok_actions          = local.alarm_actions
  tags                = var.tags
}

# A Node whose machine node-fencer could not fence if it died now (the
# witness round that ends each sweep: a permission the role lost, an instance
# the region does not have), in two 15-minute windows running: a person should
# mend it before the node dies. Sweeps run on the main function.
resource "aws_cloudwatch_metric_alarm" "witness_failing" {
  alarm_name          = "${local.functions["main"].name}-witness-failing"
  alarm_description   = "${local.functions["main"].name} could not fence some Node if it died now: the witness round of its sweeps fails for it. The WitnessFailing Events on those Nodes, and the sweep's report (witness.failing), say why and what mends it; node-fencer preflight checks the permissions."
  namespace           = "NodeFencer"
  metric_name         = "WitnessFailures"
  dimensions          = { Function = local.functions["main"].name }
  statistic           = "Maximum"
  period              = 900
  evaluation_periods  = 2
  datapoints_to_alarm = 2
  threshold           = 0
  comparison_operator = "GreaterThanThreshold"
  treat_missing_data  = "notBreaching"
  alarm_actions       = local.alarm_actions
  ok_actions          = local.alarm_actions
  tags                = var.tags
}

locals {
  dependency_alarms = {
    for pair in setproduct(keys(local.functions), ["EC2", "Kubernetes"]) :
    "${pair[0]}-${lower(pair[1])}" => { function = pair[0], dependency = pair[1] }
  }
}

resource "aws_cloudwatch_dashboard" "this" {
  dashboard_name = var.name
  dashboard_body = templatefile("${path.module}/templates/dashboard.json.tftpl", {
    region = data.aws_region.current.region
    main   = local.functions["main"].name
  })
}

################################################################################
# Alertmanager webhook: Function URL and bearer token
################################################################################

# authorization_type NONE: Alertmanager's webhook_configs can send a bearer
# token but cannot sign requests with SigV4, which AWS_IAM would require. The
# function itself rejects every request whose Authorization header does not
# carry the token below, and changes nothing for it.
# For NONE the aws provider (>= 6.29) adds the two public resource-policy
# statements a function URL needs (lambda:InvokeFunctionUrl, and
# lambda:InvokeFunction only when invoked through the URL).
# The URL belongs to the webhook function, never to the main one: anyone can
# call it, and those calls must not take the concurrency EventBridge events and
# the recovery schedule need.
################################################################################
# Notifications: one message per fencing, refusal, power-off and recovery
################################################################################

resource "aws_sns_topic" "notifications" {
  count = var.create_notification_topic ? 1 : 0

  name = "${var.name}-notifications"
  # The AWS-managed key: its key policy lets any principal of the account
  # that may publish use it through SNS, so the role needs no KMS grant.
  kms_master_key_id = "alias/aws/sns"
  tags              = var.tags
}

resource "aws_sns_topic_subscription" "email" {
  for_each = var.create_notification_topic ? toset(var.notification_emails) : toset([])

  topic_arn = aws_sns_topic.notifications[0].arn
  protocol  = "email"
  endpoint  = each.value
}

resource "aws_lambda_function_url" "this" {
  #checkov:skip=CKV_AWS_258:Alertmanager cannot sign SigV4 requests; the function authenticates every request with a bearer token kept in Secrets Manager or SSM.
  count = var.enable_alertmanager_url ? 1 : 0

  function_name      = aws_lambda_function.this["webhook"].function_name
  authorization_type = "NONE"

  lifecycle {
    # With neither function reserved, URL callers could take the account's
    # unreserved concurrency that the main function then runs on.
    precondition {
      condition     = var.reserved_concurrent_executions != -1 || var.webhook_reserved_concurrent_executions != -1
      error_message = "With enable_alertmanager_url, reserved_concurrent_executions and webhook_reserved_concurrent_executions cannot both be -1: the public URL's callers could then use up the concurrency the main function needs."
    }
  }
}

resource "random_password" "webhook_token" {
  count = var.enable_alertmanager_url ? 1 : 0

  # Letters and digits only: the token goes into an HTTP header and a file.
  length  = 48
  special = false
}

resource "aws_secretsmanager_secret" "webhook_token" {
  #checkov:skip=CKV2_AWS_57:Rotation must update Alertmanager in the same step; rotate with `terraform apply -replace=module.<name>.random_password.webhook_token[0]` and roll the Alertmanager secret.
  #checkov:skip=CKV_AWS_149:A customer key is opt-in through kms_key_arn; the default aws/secretsmanager key needs no key policy of the deployer's own.
  count = local.webhook_token_in_secretsmanager ? 1 : 0

  name                    = "${var.name}/alertmanager-webhook-token"
  description             = "Bearer token Alertmanager presents to the function URL of ${local.webhook_function_name}."
  kms_key_id              = var.kms_key_arn
  recovery_window_in_days = var.secret_recovery_window_days
  tags                    = var.tags
}

resource "aws_secretsmanager_secret_version" "webhook_token" {
  count = local.webhook_token_in_secretsmanager ? 1 : 0

  secret_id     = aws_secretsmanager_secret.webhook_token[0].id
  secret_string = random_password.webhook_token[0].result
}

resource "aws_ssm_parameter" "webhook_token" {
  #checkov:skip=CKV_AWS_337:A customer key is opt-in through kms_key_arn; the default aws/ssm key needs no key policy of the deployer's own.
  count = local.webhook_token_in_ssm ? 1 : 0

  name        = "/${var.name}/alertmanager-webhook-token"
  description = "Bearer token Alertmanager presents to the function URL of ${local.webhook_function_name}."
  type        = "SecureString"
  key_id      = var.kms_key_arn
  value       = random_password.webhook_token[0].result
  tags        = var.tags
}

locals {
  alertmanager_receiver = var.enable_alertmanager_url ? templatefile("${path.module}/templates/alertmanager-receiver.yaml.tftpl", {
    name             = var.name
    url              = aws_lambda_function_url.this[0].function_url
    credentials_file = var.alertmanager_credentials_file
  }) : null
}

################################################################################
# IAM: the functions' role
#
# One role for both functions: they run the same code with the same settings,
# so they need the same EC2, Secrets Manager/SSM and Kubernetes access, and the
# one EKS access entry (role -> group node-fencer) serves both.
################################################################################

data "aws_iam_policy_document" "assume_role" {
  statement {
    sid     = "LambdaAssumeRole"
    actions = ["sts:AssumeRole"]

    principals {
      type        = "Service"
      identifiers = ["lambda.amazonaws.com"]
    }
  }
}

resource "aws_iam_role" "this" {
  name                 = var.name
  description          = "Execution role of the ${var.name} Lambda functions."
  assume_role_policy   = data.aws_iam_policy_document.assume_role.json
  permissions_boundary = var.permissions_boundary_arn
  tags                 = var.tags
}

# The AWS calls the function's code makes, and nothing else. The list must
# equal AWS_ACTIONS in handler/src/core/settings/permissions.rs; tests/infra checks it.
data "aws_iam_policy_document" "api" {
  # DescribeInstances and DescribeVolumes support no resource-level
  # permissions or resource conditions: "*" is the only resource IAM accepts.
  statement {
    sid       = "DescribeInstancesAndVolumes"
    actions   = ["ec2:DescribeInstances", "ec2:DescribeVolumes"]
    resources = ["*"]
  }

  # DetachVolume is authorized on the volume and on the instance separately,
  # so each gets its own statement: a tag condition on the volume statement
  # must not also have to hold for the instance.
  statement {
    sid       = "DetachTaggedVolumes"
    actions   = ["ec2:DetachVolume"]
    resources = ["arn:${local.partition}:ec2:${local.region}:${local.account_id}:volume/*"]

    dynamic "condition" {
      for_each = var.detach_volume_require_tag ? [local.detach_volume_tag] : []

      content {
        test     = "StringEquals"
        variable = "aws:ResourceTag/${condition.value.key}"
        values   = [condition.value.value]
      }
    }
  }

  statement {
    sid       = "DetachFromInstances"
    actions   = ["ec2:DetachVolume"]
    resources = ["arn:${local.partition}:ec2:${local.region}:${local.account_id}:instance/*"]
  }

  # Endpoint and CA of the one cluster, unless they are given.
  dynamic "statement" {
    for_each = local.describe_cluster ? [true] : []

    content {
      sid       = "DescribeCluster"
      actions   = ["eks:DescribeCluster"]
      resources = ["arn:${local.partition}:eks:${local.region}:${local.account_id}:cluster/${var.cluster_name}"]
    }
  }

  # Active fencing only: the instances' status checks, recorded with each
  # power-off decision. DescribeInstanceStatus supports no resource-level
  # permissions: "*" is the only resource IAM accepts.
  dynamic "statement" {
    for_each = local.active_fencing ? [true] : []

    content {
      sid       = "DescribeInstanceStatus"
      actions   = ["ec2:DescribeInstanceStatus"]
      resources = ["*"]
    }
  }

  # Active fencing only: the power-off, on the cluster's own instances alone,
  # those carrying local.power_off_instance_tag.
  dynamic "statement" {
    for_each = local.active_fencing ? [local.power_off_instance_tag] : []

    content {
      sid       = "StopClusterInstances"
      actions   = ["ec2:StopInstances"]
      resources = ["arn:${local.partition}:ec2:${local.region}:${local.account_id}:instance/*"]

      condition {
        test     = "StringEquals"
        variable = "aws:ResourceTag/${statement.value.key}"
        values   = [statement.value.value]
      }
    }
  }

  # Active fencing: never a control-plane machine unless power_off_control_plane
  # allows it. The code makes that decision; this Deny, which no Allow
  # overrides, holds should a decision ever be wrong. One statement per tag,
  # as every condition of one statement must hold for it to apply.
  dynamic "statement" {
    for_each = local.deny_control_plane_stop ? var.control_plane_instance_tags : []

    content {
      sid       = "DenyStopControlPlane${statement.key}"
      effect    = "Deny"
      actions   = ["ec2:StopInstances"]
      resources = ["arn:${local.partition}:ec2:${local.region}:${local.account_id}:instance/*"]

      condition {
        test     = "StringLike"
        variable = "aws:ResourceTag/${statement.value.key}"
        values   = [statement.value.value]
      }
    }
  }

  # The notifications, on their one topic only.
  dynamic "statement" {
    for_each = local.notify ? [true] : []

    content {
      sid       = "PublishNotifications"
      actions   = ["sns:Publish"]
      resources = [local.notification_topic_arn]
    }
  }

  # Kubeconfig and/or webhook token, only the configured parameters.
  dynamic "statement" {
    for_each = length(local.ssm_parameter_arns) > 0 ? [true] : []

    content {
      sid       = "ReadParameters"
      actions   = ["ssm:GetParameter"]
      resources = local.ssm_parameter_arns
    }
  }

  # Kubeconfig and/or webhook token, only the configured secrets.
  dynamic "statement" {
    for_each = length(local.secret_arns) > 0 ? [true] : []

    content {
      sid       = "ReadSecrets"
      actions   = ["secretsmanager:GetSecretValue"]
      resources = local.secret_arns
    }
  }

  lifecycle {
    # Without a tag the power-off could not be scoped to the cluster's
    # instances; outside EKS the module cannot tell which tag they carry.
    precondition {
      condition     = !local.active_fencing || local.power_off_instance_tag != null
      error_message = "active_fencing needs power_off_instance_tag outside EKS mode (kubeconfig_ssm_parameter_name or kubeconfig_secret_arn): set it to the tag {key, value} every node instance of the cluster carries, e.g. { key = \"kubernetes.io/cluster/<name>\", value = \"owned\" }; ec2:StopInstances is granted only on instances carrying it."
    }
  }
}

# What the Lambda platform does with the role on the functions' behalf: write
# their logs, deliver failed events, decrypt what SSM and Secrets Manager return,
# manage network interfaces when the function runs in a VPC.
data "aws_iam_policy_document" "runtime" {
  statement {
    sid       = "WriteLogs"
    actions   = ["logs:CreateLogStream", "logs:PutLogEvents"]
    resources = [for group in aws_cloudwatch_log_group.this : "${group.arn}:*"]
  }

  statement {
    sid       = "OnFailureDestination"
    actions   = ["sqs:SendMessage"]
    resources = [aws_sqs_queue.dlq.arn]
  }

  dynamic "statement" {
    for_each = var.kms_key_arn != null ? [true] : []

    content {
      sid       = "DecryptParametersAndSecrets"
      actions   = ["kms:Decrypt"]
      resources = [var.kms_key_arn]

      condition {
        test     = "StringEquals"
        variable = "kms:ViaService"
        values   = ["ssm.${local.region}.amazonaws.com", "secretsmanager.${local.region}.amazonaws.com"]
      }
    }
  }

  # The permissions Lambda needs to attach the function to the VPC (those of
  # AWSLambdaVPCAccessExecutionRole). Lambda checks them against "*" when the
  # function is created or updated, so they cannot be scoped further.
  dynamic "statement" {
    for_each = length(var.vpc_subnet_ids) > 0 ? [true] : []

    content {
      sid = "VpcNetworkInterfaces"
      actions = [
        "ec2:AssignPrivateIpAddresses",
        "ec2:CreateNetworkInterface",
        "ec2:DeleteNetworkInterface",
        "ec2:DescribeNetworkInterfaces",
        "ec2:DescribeSubnets",
        "ec2:UnassignPrivateIpAddresses",
      ]
      resources = ["*"]
    }
  }
}

data "aws_iam_policy_document" "this" {
  source_policy_documents = [
    data.aws_iam_policy_document.api.json,
    data.aws_iam_policy_document.runtime.json,
  ]
}

resource "aws_iam_role_policy" "this" {
  name   = "${var.name}-least-privilege"
  role   = aws_iam_role.this.id
  policy = data.aws_iam_policy_document.this.json
}
