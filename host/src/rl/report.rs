//! `report.png`: a run's curves from its `metrics.jsonl`, each phase on axes of its own: the
//! warm-up's loss per token and its evaluations (held-out loss, success rates) over the warm-up's
//! steps, and RL's mean reward and greedy evaluations over RL's steps (step 0: before RL). A
//! run of one phase draws one row.

use std::path::Path;

use anyhow::Context;
use plotters::prelude::*;
use plotters::style::{FontStyle, register_font};

/// The font the labels are drawn with, built into the binary (no system fonts are read).
const FONT: &[u8] = include_bytes!("../../assets/DejaVuSans.ttf");

/// One curve: a name and its (step, value) points.
type Curve = (String, Vec<(f64, f64)>);

/// The curves of one panel.
struct Panel {
    title: String,
    curves: Vec<Curve>,
    /// Rates are drawn on 0..1 whatever their values.
    rates: bool,
}

impl Panel {
    /// A panel of `phase`'s `what`; a panel of one curve is titled by it, having no legend.
    fn new(phase: &str, what: &str, curves: Vec<Curve>) -> Self {
        let title = match &curves[..] {
            [(name, _)] => format!("{phase}: {name}"),
            _ => format!("{phase}: {what}"),
        };
        Panel {
            title,
            rates: !curves.is_empty() && curves.iter().all(|c| c.0.ends_with("success rate")),
            curves,
        }
    }
}

/// A phase's curves: its training curve and its evaluations, by name in order of appearance.
#[derive(Default)]
struct Phase {
    training: Vec<(f64, f64)>,
    evaluations: Vec<Curve>,
}

impl Phase {
    fn add(&mut self, name: String, x: f64, y: f64) {
        match self.evaluations.iter_mut().find(|c| c.0 == name) {
            Some(curve) => curve.1.push((x, y)),
            None => self.evaluations.push((name, vec![(x, y)])),
        }
    }

    /// The success rates of `evals` (a policy name to its evaluation), each at `x`.
    fn add_rates(&mut self, evals: &serde_json::Map<String, serde_json::Value>, x: f64) {
        let several = evals.len() > 1;
        // A held-out evaluation is a loss; its success rate means nothing.
        for (name, eval) in evals.iter().filter(|(_, e)| !e["loss"].is_f64()) {
            if let Some(rate) = eval["success_rate"].as_f64() {
                let curve = match several {
                    true => format!("{name}: greedy success rate"),
                    false => "greedy success rate".into(),
                };
                self.add(curve, x, rate);
            }
        }
    }
}

/// Read `metrics.jsonl` into the panels to draw, a row per phase that ran: [training,
/// evaluation].
fn panels(metrics: &Path) -> anyhow::Result<Vec<[Panel; 2]>> {
    let text = std::fs::read_to_string(metrics)
        .with_context(|| format!("reading {}", metrics.display()))?;
    let (mut sft, mut rl) = (Phase::default(), Phase::default());
    for line in text.lines() {
        let line: serde_json::Value = serde_json::from_str(line)
            .with_context(|| format!("{}: a line is not JSON", metrics.display()))?;
        let step = line["step"].as_f64().unwrap_or(0.0) + 1.0;
        let is_rl = line["phase"] == "rl";
        let phase = if is_rl { &mut rl } else { &mut sft };
        let value = if is_rl { "reward_mean" } else { "loss" };
        phase
            .training
            .push((step, line[value].as_f64().unwrap_or(0.0)));
        // The evaluations before the phase's first step, on its first line.
        if let Some(initial) = line["initial_evals"].as_object() {
            for eval in initial.values() {
                if let Some(loss) = eval["loss"].as_f64() {
                    phase.add("held-out loss".into(), 0.0, loss);
                }
            }
            phase.add_rates(initial, 0.0);
        }
        // A held-out evaluation is a loss; its success rate means nothing.
        if let Some(loss) = line["eval"]["loss"].as_f64() {
            phase.add("held-out loss".into(), step, loss);
        } else if let Some(policies) = line["policy_evals"].as_object() {
            phase.add_rates(policies, step);
        } else if let Some(rate) = line["eval"]["success_rate"].as_f64() {
            phase.add("greedy success rate".into(), step, rate);
        }
    }
    let mut rows = Vec::new();
    if !sft.training.is_empty() {
        let training = vec![("training loss per token".to_string(), sft.training)];
        rows.push([
            Panel::new("warm-up", "training", training),
            Panel::new("warm-up", "evaluation", sft.evaluations),
        ]);
    }
    if !rl.training.is_empty() {
        let training = vec![("mean reward".to_string(), rl.training)];
        rows.push([
            Panel::new("RL", "training", training),
            Panel::new("RL", "greedy evaluation", rl.evaluations),
        ]);
    }
    Ok(rows)
}

/// Draw `metrics` (a `metrics.jsonl`) into the PNG `out`.
pub fn write_report(metrics: &Path, out: &Path) -> anyhow::Result<()> {
    let rows = panels(metrics)?;
    // Registering twice is harmless; a bad font would be our bug, not the user's.
    register_font("sans-serif", FontStyle::Normal, FONT)
        .map_err(|_| anyhow::anyhow!("the built-in font does not load"))?;
    let height = 440 * rows.len().max(1) as u32;
    crate::store::write_atomic_via_path(out, |temp| {
        let draw = || -> anyhow::Result<()> {
            let root = BitMapBackend::new(temp, (1200, height)).into_drawing_area();
            root.fill(&WHITE)?;
            let areas = root.split_evenly((rows.len().max(1), 2));
            for (area, panel) in areas.iter().zip(rows.iter().flatten()) {
                draw_panel(area, panel)?;
            }
            root.present()?;
            Ok(())
        };
        draw().map_err(std::io::Error::other)
    })
    .with_context(|| format!("writing {}", out.display()))
}

fn draw_panel<DB: DrawingBackend>(
    area: &DrawingArea<DB, plotters::coord::Shift>,
    panel: &Panel,
) -> anyhow::Result<()>
where
    DB::ErrorType: 'static,
{
    let points = panel.curves.iter().flat_map(|c| c.1.iter());
    let (mut x_max, mut y_min, mut y_max) = (1.0f64, f64::INFINITY, f64::NEG_INFINITY);
    for &(x, y) in points {
        x_max = x_max.max(x);
        y_min = y_min.min(y);
        y_max = y_max.max(y);
    }
    if !y_min.is_finite() || panel.rates {
        (y_min, y_max) = (0.0, 1.0);
    }
    let pad = ((y_max - y_min) * 0.05).max(1e-3);
    let mut chart = ChartBuilder::on(area)
        .caption(&panel.title, ("sans-serif", 22))
        .margin(12)
        .x_label_area_size(36)
        .y_label_area_size(56)
        .build_cartesian_2d(0.0..x_max, (y_min - pad)..(y_max + pad))?;
    // Whole steps on x; on y, as many decimals as the range needs.
    let decimals = match y_max - y_min {
        span if span >= 10.0 => 0,
        span if span >= 1.0 => 1,
        span if span >= 0.1 => 2,
        _ => 3,
    };
    chart
        .configure_mesh()
        .x_desc("step")
        .x_labels(x_max.min(10.0) as usize + 1)
        .y_labels(6)
        .x_label_formatter(&|x| format!("{x:.0}"))
        .y_label_formatter(&|y| {
            // No "-0.00": a value that rounds to zero is zero.
            let shown = format!("{y:.decimals$}");
            match shown
                .trim_start_matches('-')
                .bytes()
                .all(|b| b == b'0' || b == b'.')
            {
                true => shown.trim_start_matches('-').to_string(),
                false => shown,
            }
        })
        .label_style(("sans-serif", 14))
        .draw()?;
    let colors = [BLUE, RED, GREEN, MAGENTA, CYAN, BLACK];
    for (i, (name, curve)) in panel.curves.iter().enumerate() {
        let color = colors[i % colors.len()];
        chart
            .draw_series(LineSeries::new(
                curve.iter().copied(),
                color.stroke_width(2),
            ))?
            .label(name.as_str())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 16, y)], color));
        if curve.len() < 40 {
            chart.draw_series(
                curve
                    .iter()
                    .map(|&(x, y)| Circle::new((x, y), 3, color.filled())),
            )?;
        }
    }
    // One curve is named by the panel's title.
    if panel.curves.len() > 1 {
        chart
            .configure_series_labels()
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .label_font(("sans-serif", 14))
            .draw()?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_report_draws_each_phase_on_its_own_axes_with_every_policy() {
        let dir = tempfile::tempdir().unwrap();
        let metrics = dir.path().join("metrics.jsonl");
        let lines = [
            r#"{"step":0,"phase":"sft","loss":2.0,"reward_mean":0.0}"#,
            r#"{"step":1,"phase":"sft","loss":1.0,"reward_mean":0.0,"eval":{"loss":1.5,"success_rate":0.0}}"#,
            r#"{"step":0,"phase":"rl","loss":0.1,"reward_mean":0.2,"initial_evals":{"x":{"success_rate":0.3},"o":{"success_rate":0.1}}}"#,
            r#"{"step":1,"phase":"rl","loss":0.1,"reward_mean":0.5,"eval":{"success_rate":0.7},"policy_evals":{"x":{"success_rate":0.7},"o":{"success_rate":0.4}}}"#,
        ];
        std::fs::write(&metrics, lines.join("\n")).unwrap();
        let rows = panels(&metrics).unwrap();
        assert_eq!(rows.len(), 2, "a row per phase");
        let [warmup, _] = &rows[0];
        assert_eq!(warmup.title, "warm-up: training loss per token");
        assert_eq!(warmup.curves[0].1, vec![(1.0, 2.0), (2.0, 1.0)]);
        // Its held-out evaluation is a loss alone.
        let names: Vec<&str> = rows[0][1].curves.iter().map(|c| c.0.as_str()).collect();
        assert_eq!(names, ["held-out loss"]);
        // RL's steps on an axis of their own, from 1; its evaluations from 0 (before RL).
        let [reward, evaluation] = &rows[1];
        assert_eq!(reward.curves[0].1, vec![(1.0, 0.2), (2.0, 0.5)]);
        let names: Vec<&str> = evaluation.curves.iter().map(|c| c.0.as_str()).collect();
        assert_eq!(names, ["o: greedy success rate", "x: greedy success rate"]);
        assert_eq!(evaluation.curves[1].1, vec![(0.0, 0.3), (2.0, 0.7)]);
        assert!(evaluation.rates);

        let png = dir.path().join("report.png");
        write_report(&metrics, &png).unwrap();
        let bytes = std::fs::read(&png).unwrap();
        assert_eq!(&bytes[1..4], b"PNG");
        assert_eq!(
            std::fs::read_dir(dir.path()).unwrap().count(),
            2,
            "no temporary left"
        );
        // A run of RL only draws one row.
        std::fs::write(&metrics, lines[2..].join("\n")).unwrap();
        assert_eq!(panels(&metrics).unwrap().len(), 1);
        write_report(&metrics, &png).unwrap();
    }
}
