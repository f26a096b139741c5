//! `palisade demo --report out.svg`: a picture of a run — jobs finished per second, leases
//! lost and stale writes the fence refused, over time — from the process' own metrics, sampled while the
//! demo runs.

use std::path::Path;

use anyhow::Context as _;
use palisade::metrics::{sample_sum, FENCE_REJECTIONS, JOBS_FINISHED, LEASES_LOST};
use plotters::prelude::*;

/// One sample of the counters, `t` seconds into the run.
#[derive(Clone, Copy, Debug)]
struct Sample {
    t: f64,
    finished: u64,
    lost: u64,
    rejected: u64,
}

/// One chart: title, points, colour.
type Panel = (&'static str, Vec<(f64, f64)>, RGBColor);

/// The run's counters over time.
#[derive(Debug, Default)]
pub struct Timeline(Vec<Sample>);

impl Timeline {
    /// Records the counters in Prometheus text `metrics` at `t` seconds.
    pub fn sample(&mut self, t: f64, metrics: &str) {
        self.0.push(Sample {
            t,
            finished: sample_sum(metrics, JOBS_FINISHED, &[]),
            lost: sample_sum(metrics, LEASES_LOST, &[]),
            rejected: sample_sum(metrics, FENCE_REJECTIONS, &[("reason", "stale_token")]),
        });
    }

    /// Jobs finished per second between consecutive samples.
    fn rate(&self) -> Vec<(f64, f64)> {
        self.0
            .windows(2)
            .filter(|w| w[1].t > w[0].t)
            .map(|w| {
                let jobs = w[1].finished.saturating_sub(w[0].finished) as f64;
                (w[1].t, jobs / (w[1].t - w[0].t))
            })
            .collect()
    }

    /// Draws three stacked charts into an SVG file at `path`.
    pub fn plot(&self, path: &Path) -> anyhow::Result<()> {
        let end = self.0.last().map_or(1.0, |s| s.t).max(0.1);
        let rate = self.rate();
        let panels: [Panel; 3] = [
            ("jobs finished / s", rate, BLUE),
            (
                "leases lost (total)",
                self.0.iter().map(|s| (s.t, s.lost as f64)).collect(),
                RGBColor(230, 120, 0),
            ),
            (
                "stale writes refused by the fence (total)",
                self.0.iter().map(|s| (s.t, s.rejected as f64)).collect(),
                RED,
            ),
        ];
        let root = SVGBackend::new(path, (900, 720)).into_drawing_area();
        root.fill(&WHITE).context("drawing the report")?;
        for (area, (title, points, color)) in root.split_evenly((3, 1)).iter().zip(panels) {
            let top = points.iter().map(|p| p.1).fold(0.0, f64::max).max(1.0) * 1.1;
            let mut chart = ChartBuilder::on(area)
                .caption(title, ("sans-serif", 18))
                .margin(8)
                .x_label_area_size(28)
                .y_label_area_size(60)
                .build_cartesian_2d(0.0..end, 0.0..top)
                .context("drawing the report")?;
            chart
                .configure_mesh()
                .x_desc("seconds")
                .light_line_style(WHITE.mix(0.0))
                .draw()
                .context("drawing the report")?;
            chart
                .draw_series(LineSeries::new(points, color.stroke_width(2)))
                .context("drawing the report")?;
        }
        root.present()
            .with_context(|| format!("writing {}", path.display()))?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_come_from_counter_differences_and_the_svg_is_written() {
        let mut t = Timeline::default();
        let text = |finished: u64, rejected: u64| {
            format!(
                "{JOBS_FINISHED}{{outcome=\"completed\"}} {finished}\n\
                 {FENCE_REJECTIONS}{{reason=\"stale_token\"}} {rejected}\n"
            )
        };
        t.sample(0.0, &text(0, 0));
        t.sample(0.5, &text(100, 0));
        t.sample(1.0, &text(100, 1));
        assert_eq!(t.rate(), vec![(0.5, 200.0), (1.0, 0.0)]);
        let path = std::env::temp_dir().join(format!("palisade-report-{}.svg", std::process::id()));
        t.plot(&path).unwrap();
        let svg = std::fs::read_to_string(&path).unwrap();
        let _ = std::fs::remove_file(&path);
        assert!(
            svg.starts_with("<svg") && svg.contains("stale writes refused"),
            "{svg}"
        );
    }
}
