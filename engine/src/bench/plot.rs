//! SVG line plots of bench results, written beside the JSON under `target/bench/`, their
//! names stamped with the run's time as the JSON's are ([`super::stamp`]).

use std::path::{Path, PathBuf};

use anyhow::anyhow;
use plotters::prelude::*;

/// One line of a plot.
#[derive(Debug, Clone)]
pub struct Line {
    pub name: String,
    pub points: Vec<(f64, f64)>,
}

/// What a plot shows.
#[derive(Debug, Clone, Copy)]
pub struct Axes<'a> {
    pub title: &'a str,
    pub x: &'a str,
    pub y: &'a str,
}

/// Draws `lines` into `dir/<name>-<run's stamp>.svg`; returns the path.
///
/// # Errors
/// When the file cannot be written.
pub fn lines(dir: &Path, name: &str, axes: Axes<'_>, lines: &[Line]) -> anyhow::Result<PathBuf> {
    let path = dir.join(format!("{name}-{}.svg", super::stamp()));
    draw(&path, name, axes, lines)?;
    Ok(path)
}

fn draw(path: &Path, name: &str, axes: Axes<'_>, lines: &[Line]) -> anyhow::Result<()> {
    let all = lines.iter().flat_map(|l| l.points.iter());
    let (x_max, y_max) = all.fold((0.0_f64, 0.0_f64), |(x, y), (px, py)| (x.max(*px), y.max(*py)));
    let root = SVGBackend::new(path, (900, 520)).into_drawing_area();
    let e = |e: DrawingAreaErrorKind<_>| anyhow!("plot {name}: {e:?}");
    root.fill(&WHITE).map_err(e)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(axes.title, ("sans-serif", 20))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(0.0..(x_max * 1.02).max(1.0), 0.0..(y_max * 1.08).max(1.0))
        .map_err(e)?;
    chart.configure_mesh().x_desc(axes.x).y_desc(axes.y).draw().map_err(e)?;
    for (i, line) in lines.iter().enumerate() {
        let color = Palette99::pick(i).to_rgba();
        chart
            .draw_series(LineSeries::new(line.points.iter().copied(), color.stroke_width(2)))
            .map_err(e)?
            .label(line.name.clone())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2)));
    }
    chart.configure_series_labels().background_style(WHITE.mix(0.8)).border_style(BLACK).draw().map_err(e)?;
    root.present().map_err(e)?;
    Ok(())
}

/// The empirical CDF of `sorted` (ascending) as at most `max_points` points.
#[must_use]
pub fn cdf(sorted: &[f64], max_points: usize) -> Vec<(f64, f64)> {
    let n = sorted.len();
    if n == 0 || max_points == 0 {
        return Vec::new();
    }
    let step = n.div_ceil(max_points).max(1);
    let mut points: Vec<(f64, f64)> = (0..n).step_by(step).map(|i| (sorted[i], (i + 1) as f64 / n as f64)).collect();
    points.push((sorted[n - 1], 1.0));
    points
}

/// Events per second in consecutive bins of `width` seconds, from `offsets` (seconds since
/// the start of the measurement, in any order): `(bin start, events / width)` of every
/// full bin. The last bin, which ends at the last event before its width is up, is left
/// out: its rate would be a false drop.
#[must_use]
pub fn full_bins(offsets: &[f64], width: f64) -> Vec<(f64, f64)> {
    let end = offsets.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    if width.is_nan() || width <= 0.0 || !end.is_finite() {
        return Vec::new();
    }
    // Bins [k * width, (k + 1) * width) that close at or before the last event.
    let full = (end / width).floor().max(0.0) as usize;
    let mut counts = vec![0_u64; full];
    for &o in offsets {
        let bin = (o.max(0.0) / width).floor() as usize;
        if let Some(c) = counts.get_mut(bin) {
            *c += 1;
        }
    }
    counts.into_iter().enumerate().map(|(k, n)| (k as f64 * width, n as f64 / width)).collect()
}

/// One phase of a scenario, for [`throughput_and_cdf`].
#[derive(Debug, Clone, Copy)]
pub struct Phase<'a> {
    pub name: &'a str,
    /// Events per second over time ([`full_bins`]).
    pub rate: &'a [(f64, f64)],
    /// The latency CDF ([`cdf`]).
    pub cdf: &'a [(f64, f64)],
}

/// A throughput plot and a latency CDF plot of `phases`, named `<scenario>-throughput` and `<scenario>-latency-cdf`; phases without
/// points are left out of each.
///
/// # Errors
/// When a file cannot be written.
pub fn throughput_and_cdf(
    dir: &Path,
    scenario: &str,
    throughput: Axes<'_>,
    cdf: Axes<'_>,
    phases: &[Phase<'_>],
) -> anyhow::Result<Vec<PathBuf>> {
    let line = |name: &str, points: &[(f64, f64)]| Line { name: name.to_owned(), points: points.to_vec() };
    let rates: Vec<Line> = phases.iter().filter(|p| !p.rate.is_empty()).map(|p| line(p.name, p.rate)).collect();
    let cdfs: Vec<Line> = phases.iter().filter(|p| !p.cdf.is_empty()).map(|p| line(p.name, p.cdf)).collect();
    let mut drawn = Vec::new();
    if !rates.is_empty() {
        drawn.push(lines(dir, &format!("{scenario}-throughput"), throughput, &rates)?);
    }
    if !cdfs.is_empty() {
        drawn.push(lines(dir, &format!("{scenario}-latency-cdf"), cdf, &cdfs)?);
    }
    Ok(drawn)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cdf_rises_to_one_with_few_points() {
        let sorted: Vec<f64> = (1..=1_000).map(f64::from).collect();
        let points = cdf(&sorted, 100);
        assert!(points.len() <= 101, "{}", points.len());
        assert_eq!(points.first(), Some(&(1.0, 0.001)));
        assert_eq!(points.last(), Some(&(1_000.0, 1.0)));
        assert!(points.windows(2).all(|w| w[0].0 <= w[1].0 && w[0].1 <= w[1].1));
        assert!(cdf(&[], 10).is_empty());
    }

    #[test]
    fn throughput_bins_are_full_ones_only() {
        // 10 events a second for 3 s, then 2 in the first 0.4 s of the fourth second.
        let mut offsets: Vec<f64> = (0..30).map(|i| f64::from(i) / 10.0).collect();
        offsets.extend([3.1, 3.4]);
        assert_eq!(full_bins(&offsets, 1.0), [(0.0, 10.0), (1.0, 10.0), (2.0, 10.0)]);
        // Wider bins: rates, not counts.
        assert_eq!(full_bins(&offsets, 2.0), [(0.0, 10.0)]);
        // Out of order, and a last event exactly at a bin's end closes that bin.
        assert_eq!(full_bins(&[1.5, 0.2, 2.0, 0.7], 1.0), [(0.0, 2.0), (1.0, 1.0)]);
        // Shorter than one bin: nothing to draw.
        assert!(full_bins(&[0.1, 0.5], 1.0).is_empty());
        assert!(full_bins(&[], 1.0).is_empty());
        assert!(full_bins(&[1.0, 2.0], 0.0).is_empty());
    }

    #[test]
    fn a_plot_is_an_svg_with_its_title_and_legend() {
        let dir = std::env::temp_dir().join(format!("tally-plot-{}", uuid::Uuid::new_v4().simple()));
        std::fs::create_dir_all(&dir).expect("a directory");
        let line = Line { name: "phase one".into(), points: vec![(0.0, 1.0), (1.0, 3.0), (2.0, 2.0)] };
        let path = lines(&dir, "t", Axes { title: "a title", x: "s", y: "n" }, &[line]).expect("a plot");
        let svg = std::fs::read_to_string(&path).expect("the file");
        let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        assert_eq!(name, format!("t-{}.svg", super::super::stamp()));
        assert!(svg.starts_with("<svg") && svg.contains("a title") && svg.contains("phase one"), "{svg}");
        let _ = std::fs::remove_dir_all(dir);
    }
}
