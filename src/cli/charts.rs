//! SVG pictures drawn with `plotters`: a schedule as a round-by-rank chart
//! (`stragglar plan --svg`) and the model's speedup against message size
//! (`stragglar model --svg`). Text stays SVG text: nothing here needs a font.

use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

use crate::schedule::model::{stragglar_rounds, Link, Nvls, Times};
use crate::schedule::{Op, PhaseKind, Schedule};

/// Pixels of one round-by-rank cell.
const CELL: i32 = 26;
/// Room for the rank labels at the left, the captions at the top.
const LEFT: i32 = 150;
const TOP: i32 = 92;

const REDUCE: RGBColor = RGBColor(230, 126, 34);
const COPY: RGBColor = RGBColor(52, 120, 200);
const IDLE: RGBColor = RGBColor(236, 236, 236);
const STRAGGLER: RGBColor = RGBColor(192, 40, 40);

fn failed<E: std::fmt::Debug>(what: &str) -> impl Fn(E) -> String + '_ {
    move |e| format!("{what}: {e:?}")
}

/// Draws `schedule` into `path`: one row per rank, one column per round, each cell a transfer
/// the rank sends in that round (orange: reduce, blue: copy; the chunk's number inside) or
/// idle; the straggler's row marked, the rounds before and after its arrival told apart.
/// `ring_rounds` is Ring's round count for the caption's comparison.
pub fn schedule(schedule: &Schedule, ring_rounds: usize, path: &str) -> Result<(), String> {
    let rounds: Vec<(PhaseKind, &Vec<crate::schedule::Transfer>)> = schedule
        .phases
        .iter()
        .flat_map(|p| p.rounds.iter().map(move |r| (p.kind, r)))
        .collect();
    let width = (LEFT + CELL * rounds.len() as i32 + 30).max(760) as u32;
    let height = (TOP + CELL * schedule.ranks as i32 + 60) as u32;
    let root = SVGBackend::new(path, (width, height)).into_drawing_area();
    let err = failed(path);
    root.fill(&WHITE).map_err(&err)?;
    let text = |size: i32| ("sans-serif", size).into_font();
    let after = schedule.exposed_rounds();
    let n = schedule.ranks;
    let (title, subtitle) = match schedule.straggler {
        Some(s) => (
            format!("StragglAR, {n} ranks, rank {s} late"),
            format!(
                "after it arrives: {after} rounds of M/{} = {:.2} M per GPU; Ring: {ring_rounds} rounds of M/{n} = {:.2} M",
                n - 1,
                after as f64 / (n - 1) as f64,
                ring_rounds as f64 / n as f64
            ),
        ),
        None => (format!("{n} ranks"), format!("{after} rounds")),
    };
    root.draw(&Text::new(title, (10, 8), text(16)))
        .map_err(&err)?;
    root.draw(&Text::new(subtitle, (10, 30), text(13)))
        .map_err(&err)?;
    let legend = "each cell: the chunk a rank sends that round (orange: reduced into the receiver's copy, blue: copied)";
    root.draw(&Text::new(legend, (10, 50), text(12)))
        .map_err(&err)?;
    for rank in 0..schedule.ranks {
        let y = TOP + CELL * rank as i32;
        let straggler = schedule.straggler == Some(rank);
        let label = match straggler {
            true => format!("rank {rank} (straggler)"),
            false => format!("rank {rank}"),
        };
        let color = if straggler { STRAGGLER } else { BLACK };
        let style = text(13)
            .color(&color)
            .pos(Pos::new(HPos::Right, VPos::Center));
        root.draw(&Text::new(label, (LEFT - 8, y + CELL / 2), style))
            .map_err(&err)?;
        for (column, (_, round)) in rounds.iter().enumerate() {
            let x = LEFT + CELL * column as i32;
            let sent = round.iter().find(|t| t.src == rank);
            let fill = match sent.map(|t| t.op) {
                Some(Op::Reduce) => REDUCE,
                Some(Op::Copy) => COPY,
                None => IDLE,
            };
            let cell = [(x + 1, y + 1), (x + CELL - 1, y + CELL - 1)];
            root.draw(&Rectangle::new(cell, fill.filled()))
                .map_err(&err)?;
            if let Some(t) = sent {
                let style = text(10)
                    .color(&WHITE)
                    .pos(Pos::new(HPos::Center, VPos::Center));
                root.draw(&Text::new(
                    t.chunk.to_string(),
                    (x + CELL / 2, y + CELL / 2),
                    style,
                ))
                .map_err(&err)?;
            }
        }
    }
    // The straggler's arrival: between the last ReduceScatter round and the first after it.
    let before = rounds
        .iter()
        .filter(|(kind, _)| *kind == PhaseKind::ReduceScatter)
        .count() as i32;
    let bottom = TOP + CELL * schedule.ranks as i32;
    let axis = text(12).color(&BLACK).pos(Pos::new(HPos::Left, VPos::Top));
    if schedule.straggler.is_some() {
        let x = LEFT + CELL * before;
        root.draw(&PathElement::new(
            vec![(x, TOP - 12), (x, bottom + 6)],
            STRAGGLER.stroke_width(2),
        ))
        .map_err(&err)?;
        root.draw(&Text::new(
            "before: ReduceScatter of the others, hidden by the wait",
            (LEFT, bottom + 12),
            axis.clone(),
        ))
        .map_err(&err)?;
        root.draw(&Text::new(
            format!("straggler arrives: {after} rounds from here"),
            (x + 4, TOP - 14),
            text(12).color(&STRAGGLER),
        ))
        .map_err(&err)?;
    }
    root.draw(&Text::new("round →", (LEFT, bottom + 30), axis))
        .map_err(&err)?;
    root.present().map_err(&err)
}

/// One measured line of a `stragglar bench` chart: its label, and microseconds per call (or
/// after the last arrival) for each message size in bytes.
pub type BenchLine = (String, Vec<(u64, f64)>);

/// Draws a `stragglar bench` run into `path`: its `measured` lines against message size, with
/// the model's time after the last arrival beside them where it applies (`model`: the label and
/// the time in seconds of a message of the given bytes, drawn at the first line's sizes).
pub fn bench(
    title: &str,
    measured: Vec<BenchLine>,
    model: Option<(&str, &dyn Fn(f64) -> f64)>,
    path: &str,
) -> Result<(), String> {
    let err = failed(path);
    let sizes: Vec<u64> = measured
        .first()
        .map(|(_, points)| points.iter().map(|&(b, _)| b).collect())
        .unwrap_or_default();
    if sizes.is_empty() {
        return Err(format!("{path}: no size ran, nothing to draw"));
    }
    let x = |bytes: u64| (bytes.max(1) as f64).log2();
    // The first line blue, the second red, never the model's purple.
    const MEASURED: [usize; 5] = [2, 0, 1, 4, 5];
    let mut lines: Vec<(String, Points, RGBColor)> = measured
        .into_iter()
        .enumerate()
        .map(|(i, (label, points))| {
            let points = points.iter().map(|&(b, us)| (x(b), us)).collect();
            (label, points, SERIES[MEASURED[i % MEASURED.len()]])
        })
        .collect();
    if let Some((label, time)) = model {
        let modelled = sizes
            .iter()
            .map(|&b| (x(b), time(b as f64) * 1e6))
            .collect();
        lines.push((label.to_string(), modelled, SERIES[3]));
    }
    let values = lines.iter().flat_map(|(_, p, _)| p.iter().map(|&(_, v)| v));
    let top = values.clone().fold(1e-3f64, f64::max) * 2.0;
    let bottom = values.filter(|v| *v > 0.0).fold(top, f64::min) / 2.0;
    let (first, last) = (
        x(sizes[0]),
        x(sizes[sizes.len() - 1]).max(x(sizes[0]) + 1.0),
    );
    let root = SVGBackend::new(path, (760, 460)).into_drawing_area();
    root.fill(&WHITE).map_err(&err)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 14))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(first..last, (bottom..top).log_scale())
        .map_err(&err)?;
    // A tick per power of two; the values between them are left unlabelled.
    let ticks = (last - first).round() as usize + 1;
    let whole = |p: &f64| match (p - p.round()).abs() < 1e-9 {
        true => bytes_label(2f64.powf(p.round())),
        false => String::new(),
    };
    chart
        .configure_mesh()
        .x_desc("message size")
        .y_desc("microseconds")
        .x_labels(ticks)
        .x_label_formatter(&whole)
        .y_label_formatter(&|us| format!("{us:.0}"))
        .draw()
        .map_err(&err)?;
    for (label, points, color) in lines {
        chart
            .draw_series(LineSeries::new(points.clone(), color.stroke_width(2)))
            .map_err(&err)?
            .label(label)
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 18, y)], color.stroke_width(2))
            });
        chart
            .draw_series(
                points
                    .into_iter()
                    .map(|p| Circle::new(p, 3, color.filled())),
            )
            .map_err(&err)?;
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.9))
        .border_style(BLACK.mix(0.3))
        .draw()
        .map_err(&err)?;
    root.present().map_err(&err)
}

/// The points of one line.
type Points = Vec<(f64, f64)>;

/// A baseline's modelled time (seconds) for a message of so many bytes, where it is priced.
type Baseline<'a> = dyn Fn(f64) -> Option<f64> + 'a;

/// One line of a model panel: its label, points and colour; dashed when it compares with NVLS.
struct Line {
    label: String,
    points: Points,
    color: RGBColor,
    dashed: bool,
}

/// Draws the model into `path`, two panels side by side, one colour per rank count in `ranks`,
/// links as `link` describes: the speedup after the straggler's arrival against message size
/// (64 KiB to 4 GiB), and the whole call's speedup against the straggler's delay for a message
/// of `bytes`; solid over Ring, dashed over NCCL's NVLS where `nvls` prices it.
pub fn speedup(
    ranks: &[usize],
    link: Link,
    nvls: Option<Nvls>,
    bytes: u64,
    path: &str,
) -> Result<(), String> {
    let times = |n: usize, bytes: f64| Times::new(n, stragglar_rounds(n, 1), bytes, link);
    let nvls_time = |n: usize, bytes: f64| nvls.and_then(|nvls| nvls.time(n, bytes, link));
    // Each rank count gets a line over Ring and, where NVLS is priced, a dashed one over NVLS;
    // `speedup(n, x, baseline)` is the ratio at `x` against that baseline's time.
    let lines = |points: &dyn Fn(usize, &Baseline) -> Option<Points>| {
        let mut lines = Vec::new();
        for (i, &n) in ranks.iter().enumerate() {
            let color = SERIES[i % SERIES.len()];
            let ring = |bytes: f64| Some(times(n, bytes).ring);
            let over_nvls = |bytes: f64| nvls_time(n, bytes);
            for (dashed, baseline) in [
                (false, &ring as &dyn Fn(f64) -> Option<f64>),
                (true, &over_nvls),
            ] {
                if let Some(points) = points(n, baseline) {
                    lines.push(Line {
                        label: match dashed {
                            false => format!("n = {n}, over Ring"),
                            true => format!("n = {n}, over NVLS"),
                        },
                        points,
                        color,
                        dashed,
                    });
                }
            }
        }
        lines
    };
    // Sizes 2^16..=2^32 bytes, drawn at their base-2 logarithm so that the ticks fall on them.
    let by_size = lines(&|n, baseline| {
        (16..=32)
            .map(|p| {
                let bytes = 2f64.powi(p);
                baseline(bytes).map(|t| (p as f64, t / times(n, bytes).stragglar_post))
            })
            .collect()
    });
    // Delays up to twice the longest ReduceScatter among the rank counts, in milliseconds.
    let longest = ranks
        .iter()
        .map(|&n| times(n, bytes as f64).reduce_scatter)
        .fold(0.0f64, f64::max);
    let delay_max = (2.0 * longest).max(1e-6);
    let by_delay = lines(&|n, baseline| {
        let t = times(n, bytes as f64);
        let base = baseline(bytes as f64)?;
        let points = (0..=64)
            .map(|i| {
                let delay = delay_max * i as f64 / 64.0;
                (delay * 1e3, (delay + base) / t.with_delay(delay).stragglar)
            })
            .collect();
        Some(points)
    });
    let root = SVGBackend::new(path, (1280, 480)).into_drawing_area();
    let err = failed(path);
    root.fill(&WHITE).map_err(&err)?;
    let (left, right) = root.split_horizontally(640);
    let links = format!(
        "{:.0} us per round, {:.0} GB/s links",
        link.alpha * 1e6,
        link.bandwidth / 1e9
    );
    panel(
        &left,
        &format!("Modelled StragglAR speedup after the straggler arrives ({links})"),
        ("message size", |x: &f64| bytes_label(2f64.powf(*x))),
        "baseline time / StragglAR post-arrival time",
        (16.0, 32.0),
        by_size,
        SeriesLabelPosition::LowerRight,
    )
    .map_err(&err)?;
    panel(
        &right,
        &format!(
            "Modelled whole-call speedup, {} message, against the delay",
            bytes_label(bytes as f64)
        ),
        ("the straggler's delay (ms)", |x: &f64| format!("{x:.1}")),
        "baseline time / StragglAR time, from the (n-1)-th arrival",
        (0.0, delay_max * 1e3),
        by_delay,
        SeriesLabelPosition::LowerRight,
    )
    .map_err(&err)?;
    root.present().map_err(&err)
}

/// One panel of [`speedup`]: `lines` over `x` with the baselines' line at 1.0 and a legend at
/// `legend_at`.
fn panel<DB: DrawingBackend>(
    area: &DrawingArea<DB, plotters::coord::Shift>,
    title: &str,
    (x_desc, x_label): (&str, impl Fn(&f64) -> String),
    y_desc: &str,
    (first, last): (f64, f64),
    lines: Vec<Line>,
    legend_at: SeriesLabelPosition,
) -> Result<(), DrawingAreaErrorKind<DB::ErrorType>> {
    let values = lines.iter().flat_map(|l| l.points.iter().map(|&(_, s)| s));
    let top = values.clone().fold(1.0f64, f64::max) * 1.08;
    let bottom = values.fold(1.0f64, f64::min).min(1.0) * 0.9;
    let mut chart = ChartBuilder::on(area)
        .caption(title, ("sans-serif", 13))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(50)
        .build_cartesian_2d(first..last, bottom..top)?;
    chart
        .configure_mesh()
        .x_desc(x_desc)
        .y_desc(y_desc)
        .x_labels(9)
        .x_label_formatter(&x_label)
        .draw()?;
    let even = BLACK.mix(0.5);
    chart
        .draw_series(LineSeries::new([(first, 1.0), (last, 1.0)], even))?
        .label("baseline (1.0)")
        .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], even));
    for line in lines {
        let style = line.color.stroke_width(2);
        let legend = move |(x, y): (i32, i32)| match line.dashed {
            false => PathElement::new(vec![(x, y), (x + 18, y)], style),
            true => PathElement::new(vec![(x, y), (x + 7, y)], style),
        };
        let drawn = match line.dashed {
            false => chart.draw_series(LineSeries::new(line.points, style))?,
            true => chart.draw_series(DashedLineSeries::new(line.points, 7, 5, style))?,
        };
        drawn.label(line.label).legend(legend);
    }
    chart
        .configure_series_labels()
        .position(legend_at)
        .background_style(WHITE.mix(0.9))
        .border_style(BLACK.mix(0.3))
        .draw()
}

/// Colours of the model's series, told apart on white and in grey.
const SERIES: [RGBColor; 6] = [
    RGBColor(200, 40, 40),
    RGBColor(40, 140, 60),
    RGBColor(40, 90, 200),
    RGBColor(140, 60, 170),
    RGBColor(210, 130, 20),
    RGBColor(20, 150, 160),
];

/// `65536` as `64K`, `1073741824` as `1G`.
fn bytes_label(bytes: f64) -> String {
    let b = bytes.round() as u64;
    match b {
        _ if b >= 1 << 30 && b % (1 << 30) == 0 => format!("{}G", b >> 30),
        _ if b >= 1 << 20 && b % (1 << 20) == 0 => format!("{}M", b >> 20),
        _ if b >= 1 << 10 && b % (1 << 10) == 0 => format!("{}K", b >> 10),
        _ => b.to_string(),
    }
}

/// One communicator of a straggler report, for [`arrivals`]: its title, its ranks, and per
/// call observed on every rank the rank that arrived last and how late, nanoseconds.
pub struct ArrivalPanel {
    pub title: String,
    pub ranks: usize,
    pub calls: Vec<(usize, u64)>,
}

/// Columns of an arrivals panel at most: calls are bucketed beyond.
const ARRIVAL_COLUMNS: usize = 400;

/// Draws `stragglar report --svg`: per communicator, one row per rank and one column per call
/// (or per run of calls, beyond 400), each cell coloured by the rank's lateness when it arrived
/// last there (the mean over the column's calls; white: never last), darker for later.
pub fn arrivals(panels: &[ArrivalPanel], path: &str) -> Result<(), String> {
    const ROW: i32 = 18;
    const GAP: i32 = 70;
    let columns = |p: &ArrivalPanel| p.calls.len().clamp(1, ARRIVAL_COLUMNS);
    let cell = |p: &ArrivalPanel| (800 / columns(p) as i32).clamp(2, 24);
    let width = panels
        .iter()
        .map(|p| LEFT + cell(p) * columns(p) as i32 + 30)
        .max()
        .unwrap_or(400)
        .max(760);
    let height: i32 = 40
        + panels
            .iter()
            .map(|p| GAP + ROW * p.ranks as i32)
            .sum::<i32>();
    let root = SVGBackend::new(path, (width as u32, height as u32)).into_drawing_area();
    let err = failed(path);
    root.fill(&WHITE).map_err(&err)?;
    let text = |size: i32| ("sans-serif", size).into_font();
    root.draw(&Text::new(
        "last arrival per call: each cell the rank's lateness when it arrived last (darker: later)",
        (10, 8),
        text(13),
    ))
    .map_err(&err)?;
    let mut top = 40;
    for panel in panels {
        let (columns, cell) = (columns(panel), cell(panel));
        let per = panel.calls.len().div_ceil(columns).max(1);
        // Mean lateness of each rank's last arrivals per column.
        let mut late = vec![vec![0f64; columns]; panel.ranks];
        for (i, &(last, ns)) in panel.calls.iter().enumerate() {
            if let Some(row) = late.get_mut(last) {
                row[(i / per).min(columns - 1)] += ns as f64 / per as f64;
            }
        }
        let most = late.iter().flatten().copied().fold(0.0, f64::max).max(1.0);
        root.draw(&Text::new(panel.title.clone(), (10, top + 10), text(13)))
            .map_err(&err)?;
        let grid = top + 32;
        for (rank, row) in late.iter().enumerate() {
            let y = grid + ROW * rank as i32;
            let style = text(12)
                .color(&BLACK)
                .pos(Pos::new(HPos::Right, VPos::Center));
            root.draw(&Text::new(
                format!("rank {rank}"),
                (LEFT - 8, y + ROW / 2),
                style,
            ))
            .map_err(&err)?;
            for (column, &value) in row.iter().enumerate() {
                let x = LEFT + cell * column as i32;
                let shade = (value / most).clamp(0.0, 1.0);
                let fill = RGBColor(
                    255 - (63.0 * shade) as u8,
                    255 - (215.0 * shade) as u8,
                    255 - (215.0 * shade) as u8,
                );
                let area = [(x, y + 1), (x + cell, y + ROW - 1)];
                root.draw(&Rectangle::new(area, fill.filled()))
                    .map_err(&err)?;
            }
        }
        let axis = text(11).color(&BLACK).pos(Pos::new(HPos::Left, VPos::Top));
        let bottom = grid + ROW * panel.ranks as i32;
        root.draw(&Text::new(
            format!("call → ({} calls, {per} per column)", panel.calls.len()),
            (LEFT, bottom + 4),
            axis,
        ))
        .map_err(&err)?;
        top += GAP + ROW * panel.ranks as i32;
    }
    root.present().map_err(&err)
}

#[cfg(test)]
mod tests {
    use super::bytes_label;

    #[test]
    fn sizes_are_labelled_in_powers_of_1024() {
        assert_eq!(bytes_label(65536.0), "64K");
        assert_eq!(bytes_label(4194304.0), "4M");
        assert_eq!(bytes_label(1073741824.0), "1G");
        assert_eq!(bytes_label(1000.0), "1000");
    }
}
