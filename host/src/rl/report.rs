//! `report.png`: a run's curves from its `metrics.jsonl`: the training reward (or the SFT loss)
//! per step, and each evaluation (success rate, or held-out loss) over the steps.

use std::path::Path;

use anyhow::Context;
use plotters::prelude::*;
use plotters::style::{FontStyle, register_font};

/// The font the labels are drawn with, built into the binary (no system fonts are read).
const FONT: &[u8] = include_bytes!("../../assets/DejaVuSansMono.ttf");

/// One curve: a name and its (step, value) points.
type Curve = (String, Vec<(f64, f64)>);

/// The curves of one panel.
struct Panel {
    title: &'static str,
    curves: Vec<Curve>,
    /// Rates are drawn on 0..1 whatever their values.
    rates: bool,
}

/// Read `metrics.jsonl` into the training panel and the evaluation panel. RL steps are counted
/// after the SFT steps, so both phases share one axis.
fn panels(metrics: &Path) -> anyhow::Result<[Panel; 2]> {
    let text = std::fs::read_to_string(metrics)
        .with_context(|| format!("reading {}", metrics.display()))?;
    let (mut sft_loss, mut reward) = (Vec::new(), Vec::new());
    let mut evaluations: Vec<Curve> = Vec::new();
    let mut add = |name: String, x: f64, y: f64| match evaluations.iter_mut().find(|c| c.0 == name)
    {
        Some(curve) => curve.1.push((x, y)),
        None => evaluations.push((name, vec![(x, y)])),
    };
    let mut sft_steps = 0.0;
    for line in text.lines() {
        let line: serde_json::Value = serde_json::from_str(line)
            .with_context(|| format!("{}: a line is not JSON", metrics.display()))?;
        let step = line["step"].as_f64().unwrap_or(0.0) + 1.0;
        let rl = line["phase"] == "rl";
        let x = if rl { sft_steps + step } else { step };
        if rl {
            reward.push((x, line["reward_mean"].as_f64().unwrap_or(0.0)));
        } else {
            sft_steps = step;
            sft_loss.push((x, line["loss"].as_f64().unwrap_or(0.0)));
        }
        if let Some(loss) = line["eval"]["loss"].as_f64() {
            add("held-out loss".into(), x, loss);
        }
        // The evaluation before RL (or SFT), on the first step's line.
        if let Some(initial) = line["initial_evals"].as_object() {
            let several = initial.len() > 1;
            for (name, eval) in initial {
                // SFT's first line: the held-out loss before any step.
                if let Some(loss) = eval["loss"].as_f64() {
                    add("held-out loss".into(), 0.0, loss);
                } else if let Some(rate) = eval["success_rate"].as_f64() {
                    let curve = match several {
                        true => format!("{name}: success rate"),
                        false => "success rate".into(),
                    };
                    add(curve, sft_steps, rate);
                }
            }
        }
        match line["policy_evals"].as_object() {
            Some(policies) => {
                for (name, eval) in policies {
                    if let Some(rate) = eval["success_rate"].as_f64() {
                        add(format!("{name}: success rate"), x, rate);
                    }
                }
            }
            None => {
                if let Some(rate) = line["eval"]["success_rate"].as_f64().filter(|_| rl) {
                    add("success rate".into(), x, rate);
                }
            }
        }
    }
    let mut training = Vec::new();
    if !sft_loss.is_empty() {
        training.push(("SFT loss per token".to_string(), sft_loss));
    }
    if !reward.is_empty() {
        training.push(("RL mean reward".to_string(), reward));
    }
    Ok([
        Panel {
            title: "training",
            curves: training,
            rates: false,
        },
        Panel {
            title: "greedy evaluation",
            rates: evaluations.iter().all(|c| c.0.ends_with("success rate")),
            curves: evaluations,
        },
    ])
}

/// Draw `metrics` (a `metrics.jsonl`) into the PNG `out`.
pub fn write_report(metrics: &Path, out: &Path) -> anyhow::Result<()> {
    let panels = panels(metrics)?;
    // Registering twice is harmless; a bad font would be our bug, not the user's.
    register_font("sans-serif", FontStyle::Normal, FONT)
        .map_err(|_| anyhow::anyhow!("the built-in font does not load"))?;
    crate::store::write_atomic_via_path(out, |temp| {
        let draw = || -> anyhow::Result<()> {
            let root = BitMapBackend::new(temp, (1200, 480)).into_drawing_area();
            root.fill(&WHITE)?;
            for (area, panel) in root.split_evenly((1, 2)).iter().zip(&panels) {
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
        .caption(panel.title, ("sans-serif", 22))
        .margin(12)
        .x_label_area_size(36)
        .y_label_area_size(56)
        .build_cartesian_2d(0.0..x_max, (y_min - pad)..(y_max + pad))?;
    chart
        .configure_mesh()
        .x_desc("step")
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
    if !panel.curves.is_empty() {
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
    fn a_report_has_both_phases_and_every_policy() {
        let dir = tempfile::tempdir().unwrap();
        let metrics = dir.path().join("metrics.jsonl");
        let lines = [
            r#"{"step":0,"phase":"sft","loss":2.0,"reward_mean":0.0}"#,
            r#"{"step":1,"phase":"sft","loss":1.0,"reward_mean":0.0}"#,
            r#"{"step":0,"phase":"rl","loss":0.1,"reward_mean":0.2,"initial_evals":{"x":{"success_rate":0.3},"o":{"success_rate":0.1}}}"#,
            r#"{"step":1,"phase":"rl","loss":0.1,"reward_mean":0.5,"eval":{"success_rate":0.7},"policy_evals":{"x":{"success_rate":0.7},"o":{"success_rate":0.4}}}"#,
        ];
        std::fs::write(&metrics, lines.join("\n")).unwrap();
        let [training, evaluation] = panels(&metrics).unwrap();
        assert_eq!(training.curves[0].1, vec![(1.0, 2.0), (2.0, 1.0)]);
        // RL steps continue after the two SFT steps.
        assert_eq!(training.curves[1].1, vec![(3.0, 0.2), (4.0, 0.5)]);
        let names: Vec<&str> = evaluation.curves.iter().map(|c| c.0.as_str()).collect();
        assert_eq!(names, ["o: success rate", "x: success rate"]);
        // Each starts with its evaluation before RL, after the SFT steps.
        assert_eq!(evaluation.curves[1].1, vec![(2.0, 0.3), (4.0, 0.7)]);
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
    }
}
