//! SVG plots (plotters, SVG backend): lines through the medians with min–max error bars, and
//! grouped bars.
//!
//! Axes are drawn on transformed linear coordinates (log2 for sizes, log10 for spans of
//! several decades) with labels formatted back, which keeps one code path for every scale.

use plotters::coord::Shift;
use plotters::prelude::*;

use crate::stats::Summary;
use crate::units;

/// Drawing failed.
#[derive(Debug, thiserror::Error)]
#[error("plot {title:?}: {message}")]
pub struct PlotError {
    title: String,
    message: String,
}

/// How an axis maps values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scale {
    /// Plain linear.
    Linear,
    /// log2, labelled as byte sizes (`4 KiB`).
    Log2Bytes,
    /// log10, labelled as plain numbers.
    Log10,
    /// Linear, labelled at whole numbers only (counts: clients, servers).
    Count,
}

impl Scale {
    fn fwd(self, v: f64) -> f64 {
        match self {
            Scale::Linear | Scale::Count => v,
            Scale::Log2Bytes => v.max(f64::MIN_POSITIVE).log2(),
            Scale::Log10 => v.max(f64::MIN_POSITIVE).log10(),
        }
    }

    fn label(self, t: f64) -> String {
        match self {
            Scale::Linear => trim_number(t),
            Scale::Count => {
                if (t - t.round()).abs() < 1e-6 {
                    format!("{t:.0}")
                } else {
                    String::new()
                }
            }
            Scale::Log2Bytes => {
                if (t - t.round()).abs() > 1e-6 {
                    String::new()
                } else {
                    units::size(2f64.powf(t.round()))
                }
            }
            Scale::Log10 => {
                // Label only the 1-2-5 values; ticks in between stay bare.
                let v = 10f64.powf(t);
                let decade = 10f64.powf(t.floor());
                let mantissa = v / decade;
                match [1.0, 2.0, 5.0, 10.0].iter().find(|m| (mantissa - *m).abs() < 0.03 * *m) {
                    Some(m) => compact(m * decade),
                    None => String::new(),
                }
            }
        }
    }
}

/// `200`, `2`, `0.02`: no trailing zeros.
fn compact(v: f64) -> String {
    let s = format!("{v:.6}");
    let s = s.trim_end_matches('0').trim_end_matches('.');
    s.to_string()
}

fn trim_number(v: f64) -> String {
    let d = crate::stats::decimals_for(v);
    format!("{v:.d$}")
}

/// One line of a [`LineChart`].
#[derive(Debug, Clone)]
pub struct Series {
    /// Legend text.
    pub name: String,
    /// Points: x and the summary of the runs at x.
    pub points: Vec<(f64, Summary)>,
    /// Dashed (a baseline) rather than solid.
    pub dashed: bool,
}

impl Series {
    /// A solid line.
    pub fn new(name: impl Into<String>, points: Vec<(f64, Summary)>) -> Series {
        Series { name: name.into(), points, dashed: false }
    }

    /// A dashed line (baselines).
    pub fn baseline(name: impl Into<String>, points: Vec<(f64, Summary)>) -> Series {
        Series { name: name.into(), points, dashed: true }
    }
}

/// Lines through medians with min–max error bars.
#[derive(Debug, Clone)]
pub struct LineChart {
    /// Caption.
    pub title: String,
    /// X axis description.
    pub x_desc: String,
    /// Y axis description.
    pub y_desc: String,
    /// X scale.
    pub x_scale: Scale,
    /// Y scale.
    pub y_scale: Scale,
    /// The lines.
    pub series: Vec<Series>,
}

/// Colour-blind-friendly palette (Okabe–Ito), then greys.
const PALETTE: [RGBColor; 8] = [
    RGBColor(0, 114, 178),
    RGBColor(213, 94, 0),
    RGBColor(0, 158, 115),
    RGBColor(204, 121, 167),
    RGBColor(230, 159, 0),
    RGBColor(86, 180, 233),
    RGBColor(120, 120, 120),
    RGBColor(0, 0, 0),
];

fn color(i: usize) -> RGBColor {
    PALETTE[i % PALETTE.len()]
}

const SIZE: (u32, u32) = (860, 520);

fn padded(lo: f64, hi: f64, frac: f64) -> (f64, f64) {
    if !lo.is_finite() || !hi.is_finite() {
        return (0.0, 1.0);
    }
    if (hi - lo).abs() < 1e-12 {
        let d = if lo == 0.0 { 1.0 } else { lo.abs() * 0.1 };
        return (lo - d, hi + d);
    }
    let d = (hi - lo) * frac;
    (lo - d, hi + d)
}

impl LineChart {
    /// Renders the chart as an SVG document.
    pub fn render_svg(&self) -> Result<String, PlotError> {
        let err = |e: &dyn std::fmt::Display| PlotError { title: self.title.clone(), message: e.to_string() };
        let pts: Vec<(f64, f64, f64)> = self
            .series
            .iter()
            .flat_map(|s| s.points.iter())
            .map(|(x, s)| (self.x_scale.fwd(*x), self.y_scale.fwd(s.min), self.y_scale.fwd(s.max)))
            .filter(|(x, a, b)| x.is_finite() && a.is_finite() && b.is_finite())
            .collect();
        if pts.is_empty() {
            return Err(err(&"no finite points"));
        }
        let (x0, x1) = pts.iter().fold((f64::MAX, f64::MIN), |(a, b), p| (a.min(p.0), b.max(p.0)));
        let (y0, y1) = pts.iter().fold((f64::MAX, f64::MIN), |(a, b), p| (a.min(p.1), b.max(p.2)));
        let (x0, x1) = padded(x0, x1, 0.03);
        let (mut y0, y1) = padded(y0, y1, 0.08);
        if matches!(self.y_scale, Scale::Linear | Scale::Count) && y0 > 0.0 && pts.iter().all(|p| p.1 >= 0.0)
        {
            y0 = 0.0;
        }
        let mut svg = String::new();
        {
            let root = SVGBackend::with_string(&mut svg, SIZE).into_drawing_area();
            root.fill(&WHITE).map_err(|e| err(&e))?;
            self.draw(&root, (x0, x1), (y0, y1)).map_err(|e| err(&e))?;
            root.present().map_err(|e| err(&e))?;
        }
        Ok(svg)
    }

    fn draw(
        &self,
        root: &DrawingArea<SVGBackend<'_>, Shift>,
        (x0, x1): (f64, f64),
        (y0, y1): (f64, f64),
    ) -> Result<(), Box<dyn std::error::Error + '_>> {
        let (xs, ys) = (self.x_scale, self.y_scale);
        let mut chart = ChartBuilder::on(root)
            .caption(&self.title, ("sans-serif", 20))
            .margin(12)
            .x_label_area_size(44)
            .y_label_area_size(70)
            .build_cartesian_2d(x0..x1, y0..y1)?;
        let xfmt = move |t: &f64| xs.label(*t);
        let yfmt = move |t: &f64| ys.label(*t);
        chart
            .configure_mesh()
            .x_desc(self.x_desc.as_str())
            .y_desc(self.y_desc.as_str())
            .x_label_formatter(&xfmt)
            .y_label_formatter(&yfmt)
            .x_labels(12)
            .light_line_style(RGBColor(235, 235, 235))
            .draw()?;
        for (i, s) in self.series.iter().enumerate() {
            let c = color(i);
            let mut line: Vec<(f64, f64)> =
                s.points.iter().map(|(x, m)| (xs.fwd(*x), ys.fwd(m.median))).collect();
            line.sort_by(|a, b| a.0.total_cmp(&b.0));
            let style = c.stroke_width(2);
            let anno = if s.dashed {
                chart.draw_series(DashedLineSeries::new(line.clone(), 6, 4, style))?
            } else {
                chart.draw_series(LineSeries::new(line.clone(), style))?
            };
            anno.label(s.name.as_str())
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], c.stroke_width(2)));
            chart.draw_series(line.iter().map(|&(x, y)| Circle::new((x, y), 3, c.filled())))?;
            chart.draw_series(s.points.iter().filter(|(_, m)| m.n > 1).map(|(x, m)| {
                ErrorBar::new_vertical(
                    xs.fwd(*x),
                    ys.fwd(m.min),
                    ys.fwd(m.median),
                    ys.fwd(m.max),
                    c.stroke_width(1),
                    8,
                )
            }))?;
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperLeft)
            .background_style(WHITE.mix(0.85))
            .border_style(RGBColor(160, 160, 160))
            .draw()?;
        Ok(())
    }
}

/// Grouped bars (one group per category, one bar per series) with min–max error bars.
#[derive(Debug, Clone)]
pub struct BarChart {
    /// Caption.
    pub title: String,
    /// Y axis description.
    pub y_desc: String,
    /// Category names along x.
    pub groups: Vec<String>,
    /// Series name and one value per group (missing: no bar).
    pub series: Vec<(String, Vec<Option<Summary>>)>,
    /// Logarithmic value axis (for values spanning decades).
    pub log_y: bool,
}

impl BarChart {
    /// Renders the chart as an SVG document: horizontal bars, one band per group (category
    /// names need no rotation however long), values along x.
    pub fn render_svg(&self) -> Result<String, PlotError> {
        let err = |e: &dyn std::fmt::Display| PlotError { title: self.title.clone(), message: e.to_string() };
        let vals: Vec<f64> = self
            .series
            .iter()
            .flat_map(|(_, v)| v.iter().flatten())
            .flat_map(|s| [s.min, s.max])
            .filter(|v| v.is_finite() && (!self.log_y || *v > 0.0))
            .collect();
        if vals.is_empty() || self.groups.is_empty() {
            return Err(err(&"no finite values"));
        }
        let hi = vals.iter().copied().fold(f64::MIN, f64::max);
        let lo = vals.iter().copied().fold(f64::MAX, f64::min);
        let scale = if self.log_y { Scale::Log10 } else { Scale::Linear };
        let range = if self.log_y {
            ((lo / 2.0).log10().floor(), (hi * 2.0).log10())
        } else {
            (0.0, hi.max(f64::MIN_POSITIVE) * 1.15)
        };
        let mut svg = String::new();
        {
            let band = 20 * self.series.len().max(1) as u32 + 16;
            let height = 360u32.max(band * self.groups.len() as u32 + 140);
            let root = SVGBackend::with_string(&mut svg, (SIZE.0, height)).into_drawing_area();
            root.fill(&WHITE).map_err(|e| err(&e))?;
            self.draw(&root, scale, range).map_err(|e| err(&e))?;
            root.present().map_err(|e| err(&e))?;
        }
        Ok(svg)
    }

    fn draw(
        &self,
        root: &DrawingArea<SVGBackend<'_>, Shift>,
        scale: Scale,
        (v0, v1): (f64, f64),
    ) -> Result<(), Box<dyn std::error::Error + '_>> {
        let n = self.groups.len();
        let longest = self.groups.iter().map(|g| g.chars().count()).max().unwrap_or(0) as u32;
        let mut chart = ChartBuilder::on(root)
            .caption(&self.title, ("sans-serif", 20))
            .margin(12)
            .x_label_area_size(44)
            .y_label_area_size(7 * longest + 24)
            .build_cartesian_2d(v0..v1, -0.5..n as f64 - 0.5)?;
        // Group 0 at the top.
        let row = move |gi: usize| (n - 1 - gi) as f64;
        let groups = self.groups.clone();
        let yfmt = move |t: &f64| {
            let i = t.round();
            if (t - i).abs() < 1e-6 && i >= 0.0 && (i as usize) < n {
                groups.get(n - 1 - i as usize).cloned().unwrap_or_default()
            } else {
                String::new()
            }
        };
        chart
            .configure_mesh()
            .disable_y_mesh()
            .y_labels(n * 2 + 1)
            .y_label_formatter(&yfmt)
            .y_label_style(("sans-serif", 13))
            .x_label_formatter(&|v: &f64| scale.label(*v))
            .x_desc(self.y_desc.as_str())
            .light_line_style(RGBColor(235, 235, 235))
            .draw()?;
        let k = self.series.len().max(1) as f64;
        let height = 0.8 / k;
        for (si, (name, vals)) in self.series.iter().enumerate() {
            let c = color(si);
            // Series top to bottom within a band.
            let top = move |gi: usize| row(gi) + 0.4 - si as f64 * height;
            chart
                .draw_series(vals.iter().enumerate().filter_map(|(gi, v)| {
                    v.map(|s| {
                        Rectangle::new(
                            [(v0, top(gi) - 0.02), (scale.fwd(s.median), top(gi) - height + 0.02)],
                            c.filled(),
                        )
                    })
                }))?
                .label(name.as_str())
                .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 14, y + 5)], c.filled()));
            chart.draw_series(vals.iter().enumerate().filter_map(|(gi, v)| {
                v.filter(|s| s.n > 1).map(|s| {
                    ErrorBar::new_horizontal(
                        top(gi) - height / 2.0,
                        scale.fwd(s.min),
                        scale.fwd(s.median),
                        scale.fwd(s.max),
                        BLACK.stroke_width(1),
                        6,
                    )
                })
            }))?;
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::LowerRight)
            .background_style(WHITE.mix(0.85))
            .border_style(RGBColor(160, 160, 160))
            .draw()?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(v: &[f64]) -> Summary {
        Summary::of(v).unwrap()
    }

    #[test]
    fn line_chart_renders_every_series_and_label() {
        let c = LineChart {
            title: "E2 access time".into(),
            x_desc: "size".into(),
            y_desc: "µs".into(),
            x_scale: Scale::Log2Bytes,
            y_scale: Scale::Log10,
            series: vec![
                Series::new("inline", vec![(128.0, s(&[10.0, 11.0, 12.0])), (65536.0, s(&[40.0]))]),
                Series::baseline("raw tcp", vec![(128.0, s(&[5.0])), (65536.0, s(&[9.0]))]),
            ],
        };
        let svg = c.render_svg().unwrap();
        assert!(svg.starts_with("<svg"));
        assert!(svg.contains("E2 access time"));
        assert!(svg.contains("inline") && svg.contains("raw tcp"));
        assert!(svg.contains("64 KiB"), "log2 byte labels");
    }

    #[test]
    fn bar_chart_renders_groups() {
        let c = BarChart {
            title: "E4".into(),
            y_desc: "MB/s".into(),
            groups: vec!["tcp write".into(), "softib write".into()],
            series: vec![
                ("list I/O".into(), vec![Some(s(&[100.0, 120.0])), Some(s(&[300.0]))]),
                ("no list I/O".into(), vec![Some(s(&[10.0])), None]),
            ],
            log_y: true,
        };
        let svg = c.render_svg().unwrap();
        assert!(svg.contains("softib write") && svg.contains("no list I/O"));
    }

    #[test]
    fn empty_charts_are_errors_not_panics() {
        let c = LineChart {
            title: "t".into(),
            x_desc: String::new(),
            y_desc: String::new(),
            x_scale: Scale::Linear,
            y_scale: Scale::Linear,
            series: vec![],
        };
        assert!(c.render_svg().is_err());
        let b = BarChart {
            title: "b".into(),
            y_desc: String::new(),
            groups: vec![],
            series: vec![],
            log_y: false,
        };
        assert!(b.render_svg().is_err());
    }

    #[test]
    fn scale_labels() {
        assert_eq!(Scale::Log2Bytes.label(10.0), "1 KiB");
        assert_eq!(Scale::Log2Bytes.label(10.5), "");
        assert_eq!(Scale::Log10.label(2.0), "100");
        assert_eq!(Scale::Log10.label(2.0f64.log10()), "2");
        assert_eq!(Scale::Log10.label(-1.7), "0.02");
        assert_eq!(Scale::Log10.label(1.5), "");
        assert_eq!(Scale::Log10.label(2.3), "200", "1-2-5 labels survive tick rounding");
        assert_eq!(Scale::Count.label(3.0), "3");
        assert_eq!(Scale::Count.label(2.5), "");
        assert_eq!(Scale::Linear.label(2.5), "2.50");
    }
}
