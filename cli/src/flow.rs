//! `flow show` and `flow cancel`: a flow's state and step outcomes, and cancelling it whole.

use anyhow::bail;

use super::{print_lines, runtime, RedisArgs};
use palisade::store::FlowStore;
use palisade::FlowId;
use palisade::{FlowState, StepEnd};

/// `flow`.
#[derive(Clone, Debug, clap::Subcommand)]
pub(super) enum FlowCommand {
    /// Show a flow's state, its counts by outcome and how each step that ended ended.
    Show {
        #[command(flatten)]
        redis: RedisArgs,
        /// The flow's id (as `Client::create_flow` returned it).
        flow: uuid::Uuid,
        /// Print it as one JSON object.
        #[arg(long)]
        json: bool,
    },
    /// Cancel a flow: steps not started go to the dead letters unrun, ready and running ones
    /// are cancelled (a running one's lease revoked).
    Cancel {
        #[command(flatten)]
        redis: RedisArgs,
        /// The flow's id.
        flow: uuid::Uuid,
    },
}

pub(super) fn flow(command: FlowCommand) -> anyhow::Result<()> {
    runtime()?.block_on(async {
        match command {
            FlowCommand::Show { redis, flow, json } => {
                let (_, store) = redis.store().await?;
                let client = palisade::Client::new(store.clone());
                let id = FlowId::from(flow);
                let Some(status) = client.flow(id).await? else {
                    bail!("flow {id} is not kept (never created, or finished and forgotten)");
                };
                let steps = store.flow_steps(id).await?;
                if json {
                    // The status as before, with each step in run order (`step_list`).
                    let mut out = serde_json::to_value(&status)?;
                    out["step_list"] = serde_json::to_value(&steps)?;
                    return print_lines(std::iter::once(out.to_string()));
                }
                let state = match status.state {
                    FlowState::Running => "running",
                    FlowState::Succeeded => "succeeded",
                    FlowState::Failed => "failed",
                    FlowState::Cancelled => "cancelled",
                };
                let head = format!(
                    "flow {id}: {state}; {} steps, {} released, {}",
                    status.steps,
                    status.released,
                    ends_line(&status),
                );
                // Each step in run order: where it is, what it runs after, its job.
                let rows = steps.iter().enumerate().map(|(i, s)| {
                    let state = s.state.as_str();
                    let after = if s.after.is_empty() {
                        String::new()
                    } else {
                        format!(" after {}", s.after.join(", "))
                    };
                    format!("  {:>3}. {}: {state}{after} (job {})", i + 1, s.name, s.job)
                });
                print_lines(std::iter::once(head).chain(rows))
            }
            FlowCommand::Cancel { redis, flow } => {
                let (_, store) = redis.store().await?;
                let id = FlowId::from(flow);
                match palisade::Client::new(store).cancel_flow(id).await? {
                    Some(n) => print_lines(std::iter::once(format!(
                        "flow {id} cancelled: {n} jobs stopped"
                    ))),
                    None => {
                        bail!("flow {id} is not kept (never created, or finished and forgotten)")
                    }
                }
            }
        }
    })
}

/// How a flow's steps ended so far: "<n> completed, <n> dead, <n> skipped".
pub(super) fn ends_line(status: &palisade::FlowStatus) -> String {
    format!(
        "{} completed, {} dead, {} skipped",
        status.count(StepEnd::Completed),
        status.count(StepEnd::Dead),
        status.count(StepEnd::Skipped)
    )
}
