//! Where the seconds of a recovery go. Each case of the recovery benchmark is
//! a lane of milestones, in seconds since the instance stopped, drawn on one
//! time axis as an SVG picture for the docs, or listed as text at the end of
//! a demo run.

use std::fmt::Write as _;

/// A phase of the recovery, in the order they happen.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Phase {
    /// The instance stopped: time zero.
    Stopped,
    /// The node controller marked the Node `NotReady`.
    NotReady,
    /// node-fencer was invoked; in the runbook, the operator force-deletes.
    Event,
    /// The out-of-service taint was applied.
    Tainted,
    /// The volumes were detached from the dead instance.
    Detached,
    /// The old pods were gone from the Node.
    PodsDeleted,
    /// Both replacements ran elsewhere with their volumes.
    Running,
}

impl Phase {
    /// Every phase, in the order they happen.
    pub const ALL: [Phase; 7] = [
        Phase::Stopped,
        Phase::NotReady,
        Phase::Event,
        Phase::Tainted,
        Phase::Detached,
        Phase::PodsDeleted,
        Phase::Running,
    ];

    /// How the legend and the text name the milestone.
    pub fn label(self) -> &'static str {
        self.looks().0
    }

    fn colour(self) -> &'static str {
        self.looks().1
    }

    /// The colours are Okabe-Ito, so that colour-blind readers tell the
    /// phases apart too; its yellow is left out because thin segments of it
    /// vanish on white.
    fn looks(self) -> (&'static str, &'static str) {
        match self {
            Self::Stopped => ("instance stopped", "#000000"),
            Self::NotReady => ("Node NotReady", "#E69F00"),
            Self::Event => ("event sent", "#56B4E9"),
            Self::Tainted => ("taint applied", "#009E73"),
            Self::Detached => ("volumes detached", "#CC79A7"),
            Self::PodsDeleted => ("pods deleted", "#D55E00"),
            Self::Running => ("replacements Running", "#0072B2"),
        }
    }
}

/// The lanes of the picture the docs show (`docs/recovery-timeline.svg`):
/// `bench-recovery --svg-docs` writes it only when its run drew them all.
pub const DOCS_LANES: [&str; 4] = [
    "node-fencer, through the binary",
    "node-fencer, in-process",
    "force-delete runbook (no node-fencer)",
    "left alone (no node-fencer)",
];

/// One case on the time axis.
#[derive(Clone, Debug, PartialEq)]
pub struct Lane {
    /// What the case is, as the reader should know it.
    pub name: String,
    /// Milestones reached, seconds since the stop, in any order.
    pub marks: Vec<(Phase, f64)>,
    /// For a lane that never recovered: how long it was watched, in seconds.
    pub watched_until: Option<f64>,
}

/// A lane reduced to what can be drawn: milestones by time from the stop,
/// and where an unrecovered case stopped being watched.
struct Track {
    marks: Vec<(Phase, f64)>,
    open: Option<f64>,
}

/// Times no run could have measured (not a number, before the stop, never)
/// are dropped rather than bending the axis.
fn usable(t: f64) -> bool {
    t.is_finite() && t >= 0.0
}

impl Lane {
    fn track(&self) -> Track {
        let mut marks: Vec<(Phase, f64)> = (self.marks.iter())
            .filter(|&&(p, t)| p != Phase::Stopped && usable(t))
            // Adding zero turns -0.0 into 0.0, which would print with its sign.
            .map(|&(p, t)| (p, t + 0.0))
            .collect();
        marks.sort_by(|a, b| a.1.total_cmp(&b.1).then(a.0.cmp(&b.0)));
        // The stop is time zero by definition, whatever the caller passed.
        marks.insert(0, (Phase::Stopped, 0.0));
        let last = marks.last().map_or(0.0, |m| m.1);
        let recovered = marks.iter().any(|m| m.0 == Phase::Running);
        let watched = self.watched_until.filter(|&w| usable(w) && !recovered);
        let open = watched.map(|w| w.max(last));
        Track { marks, open }
    }
}

impl Track {
    fn last(&self) -> f64 {
        self.marks.last().map_or(0.0, |m| m.1)
    }

    fn end(&self) -> f64 {
        self.open.unwrap_or_else(|| self.last())
    }
}

/// Where the axis breaks: node-fencer's cases play out in its first seconds.
const BREAK: f64 = 30.0;
/// The share of the plot's width those first seconds get on a broken axis.
const BEFORE_BREAK: f64 = 0.65;
/// Beyond this a time is a broken clock, not a recovery: drawn at the end.
const LONGEST: f64 = 1e9;
/// Room a tick label needs, in pixels.
const TICK_SPACING: f64 = 55.0;

/// Seconds to x, the same for every lane.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Scale {
    left: f64,
    width: f64,
    /// Linear up to here, compressed after; `None` for one linear axis.
    brk: Option<f64>,
    end: f64,
    steps: (f64, f64),
}

/// The smallest round step that puts at most `max` ticks on `span` seconds.
fn step_for(span: f64, max: f64) -> f64 {
    const STEPS: [f64; 12] = [
        0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 15.0, 30.0, 60.0, 120.0, 300.0, 600.0,
    ];
    let max = max.floor().max(1.0);
    (STEPS.into_iter())
        .chain(std::iter::successors(Some(1800.0), |s| Some(s * 2.0)))
        .find(|s| (span / s).floor() <= max)
        .unwrap_or(span)
}

impl Scale {
    fn new(left: f64, width: f64, longest: f64) -> Self {
        let longest = longest.clamp(1.0, LONGEST);
        // A break only pays when a linear axis would give the first seconds
        // less room than the broken one does.
        let (brk, end, steps) = if longest * BEFORE_BREAK <= BREAK {
            let step = step_for(longest, width / TICK_SPACING);
            (None, (longest / step).ceil() * step, (step, step))
        } else {
            let first = step_for(BREAK, width * BEFORE_BREAK / TICK_SPACING);
            let rest = step_for(longest - BREAK, width * (1.0 - BEFORE_BREAK) / TICK_SPACING);
            (Some(BREAK), longest, (first, rest))
        };
        Self {
            left,
            width,
            brk,
            end,
            steps,
        }
    }

    fn ticks(&self) -> Vec<f64> {
        let multiples = |step: f64, from: f64, to: f64| {
            (0u32..)
                .map(move |i| (from + f64::from(i)) * step)
                .take_while(move |t| *t <= to + 1e-9)
        };
        let (a, b) = self.steps;
        let mut out: Vec<f64> = multiples(a, 0.0, self.brk.unwrap_or(self.end)).collect();
        if let Some(brk) = self.brk {
            out.extend(multiples(b, (brk / b).floor() + 1.0, self.end));
        }
        out
    }
}

/// The x of `t` seconds: clamped to the plot, monotonic across the break.
fn x_of(t: f64, s: &Scale) -> f64 {
    let t = if t.is_nan() { 0.0 } else { t.clamp(0.0, s.end) };
    let first = s.width * BEFORE_BREAK;
    match s.brk {
        None => s.left + s.width * t / s.end,
        Some(b) if t <= b => s.left + first * t / b,
        Some(b) => s.left + first + (s.width - first) * (t - b) / (s.end - b),
    }
}

/// Seconds as people read them: milliseconds under one second.
fn duration(t: f64) -> String {
    let ms = (t * 1000.0).round();
    if t > 0.0 && ms < 1000.0 {
        format!("{ms:.0} ms")
    } else {
        format!("{t:.1} s")
    }
}

/// A coordinate, short and stable: one decimal at most.
fn c(v: f64) -> String {
    let mut s = format!("{:.1}", v + 0.0);
    if s.ends_with(".0") {
        s.truncate(s.len() - 2);
    }
    s
}

fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for ch in s.chars() {
        match ch {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            // XML 1.0 cannot carry the other control characters at all.
            '\t' | '\n' | '\r' => out.push(' '),
            ch if ch.is_control() => {}
            ch => out.push(ch),
        }
    }
    out
}

const WIDTH: f64 = 960.0;
/// Room right of the plot for "not recovered after 421 s".
const RIGHT: f64 = 175.0;
const TOP: f64 = 64.0;
const ROW: f64 = 30.0;
const BAR: f64 = 14.0;
/// A rough width of one 12 px sans-serif character, for layout only.
const CHAR: f64 = 6.5;
const MAX_NAME: usize = 46;
const UNRECOVERED: &str = "watched, not recovered";

/// An SVG picture of the lanes on one time axis.
pub fn svg(title: &str, lanes: &[Lane]) -> String {
    let tracks: Vec<Track> = lanes.iter().map(Lane::track).collect();
    let name = lanes.iter().map(|l| l.name.chars().count()).max();
    let left = (24.0 + CHAR * name.unwrap_or(0).min(MAX_NAME) as f64).max(100.0);
    let longest = tracks.iter().map(Track::end).fold(0.0, f64::max);
    let s = Scale::new(left, WIDTH - left - RIGHT, longest);
    let axis = TOP + ROW * lanes.len() as f64 + 6.0;
    let legend = legend(tracks.iter().any(|t| t.open.is_some()));
    let rows = legend.last().map_or(1.0, |e| e.3 + 1.0);
    let h = c(if lanes.is_empty() {
        TOP + 24.0
    } else {
        axis + 64.0 + 20.0 * rows
    });
    let (w, title) = (c(WIDTH), escape(title));
    let mut out = format!(
        r##"<svg xmlns="http://www.w3.org/2000/svg" version="1.1" width="{w}" height="{h}" viewBox="0 0 {w} {h}" font-family="sans-serif" font-size="12">
<defs><pattern id="unrecovered" width="6" height="6" patternUnits="userSpaceOnUse" patternTransform="rotate(45)"><rect width="6" height="6" fill="#eeeeee"/><rect width="2" height="6" fill="#aaaaaa"/></pattern></defs>
<rect width="100%" height="100%" fill="#ffffff"/>
<text x="16" y="26" font-size="15" font-weight="bold">{title}</text>
"##
    );
    if lanes.is_empty() {
        let _ = writeln!(out, r#"<text x="16" y="{TOP}">no data</text>"#);
        out.push_str("</svg>\n");
        return out;
    }
    out.push_str(r##"<text x="16" y="46" font-size="11" fill="#555555">Each segment has the colour of the milestone it ends at; hover it for its times.</text>"##);
    draw_axis(&mut out, &s, axis);
    for (row, (lane, track)) in lanes.iter().zip(&tracks).enumerate() {
        draw_lane(&mut out, &lane.name, track, row, &s);
    }
    out.push_str("\n<g>");
    for (label, fill, x, row) in legend {
        let y = axis + 56.0 + 20.0 * row;
        let (x, y, tx, ty) = (c(x), c(y - 10.0), c(x + 17.0), c(y));
        let _ = write!(
            out,
            r##"
<rect x="{x}" y="{y}" width="12" height="12" fill="{fill}" stroke="#777777" stroke-width="0.5"/><text x="{tx}" y="{ty}">{label}</text>"##
        );
    }
    out.push_str("\n</g>\n</svg>\n");
    out
}

/// Legend entries (label, fill, x, row), wrapped to the width.
fn legend(hatched: bool) -> Vec<(&'static str, &'static str, f64, f64)> {
    let extra = hatched.then_some((UNRECOVERED, "url(#unrecovered)"));
    let (mut x, mut row, mut out) = (16.0, 0.0, Vec::new());
    for (label, fill) in Phase::ALL.map(Phase::looks).into_iter().chain(extra) {
        let advance = 35.0 + CHAR * label.chars().count() as f64;
        if x + advance > WIDTH - 16.0 && x > 16.0 {
            (x, row) = (16.0, row + 1.0);
        }
        out.push((label, fill, x, row));
        x += advance;
    }
    out
}

fn draw_axis(out: &mut String, s: &Scale, y: f64) {
    let (top, bottom, plot_end) = (c(TOP), c(y), c(s.left + s.width));
    let (tick, label, caption) = (c(y + 5.0), c(y + 18.0), c(y + 34.0));
    out.push_str("\n<g>");
    for t in s.ticks() {
        let (x, t) = (c(x_of(t, s)), c(t));
        let _ = write!(
            out,
            r##"
<line x1="{x}" x2="{x}" y1="{top}" y2="{bottom}" stroke="#dddddd"/><line x1="{x}" x2="{x}" y1="{bottom}" y2="{tick}" stroke="#333333"/><text x="{x}" y="{label}" text-anchor="middle" font-size="11">{t}</text>"##
        );
    }
    let (x, mut text) = (c(s.left), "seconds since the instance stopped".to_owned());
    let _ = write!(
        out,
        r##"
<line x1="{x}" x2="{plot_end}" y1="{bottom}" y2="{bottom}" stroke="#333333"/>"##
    );
    if let Some(b) = s.brk {
        // The gap and double slash say the scale changes there; the dashed
        // line carries that up through the lanes.
        let xb = x_of(b, s);
        let (x, gap, up, low, right) = (c(xb), c(xb - 4.0), c(y - 5.0), c(y + 5.0), c(xb + 2.0));
        let left = c(xb - 6.0);
        let _ = write!(
            out,
            r##"
<line x1="{x}" x2="{x}" y1="{top}" y2="{bottom}" stroke="#999999" stroke-dasharray="2 3"/><rect x="{gap}" y="{up}" width="8" height="10" fill="#ffffff"/><path d="M{left} {low} l4 -10 M{right} {low} l4 -10" stroke="#333333" fill="none"/>"##
        );
        let _ = write!(text, " (axis compressed after {b:.0} s)");
    }
    let _ = write!(
        out,
        r#"
<text x="{plot_end}" y="{caption}" text-anchor="end" font-size="11">{text}</text>
</g>"#
    );
}

fn draw_lane(out: &mut String, name: &str, track: &Track, row: usize, s: &Scale) {
    let top = TOP + ROW * row as f64;
    // Translucent, so that the grid shows through every other lane.
    let stripe = if row.is_multiple_of(2) { "0.04" } else { "0" };
    let cut = name.chars().count() > MAX_NAME;
    let shown: String = name.chars().take(MAX_NAME - usize::from(cut)).collect();
    let (full, shown, more) = (escape(name), escape(&shown), if cut { "…" } else { "" });
    let (x, y) = (c(s.left - 12.0), c(top + ROW / 2.0 + 4.0));
    let (bar_y, cy) = (c(top + (ROW - BAR) / 2.0), c(top + ROW / 2.0));
    let (top, stripe_w) = (c(top), c(WIDTH - 16.0));
    let _ = write!(
        out,
        r#"
<g>
<rect x="8" y="{top}" width="{stripe_w}" height="{ROW}" fill-opacity="{stripe}"/>
<text x="{x}" y="{y}" text-anchor="end"><title>{full}</title>{shown}{more}</text>"#
    );
    if track.marks.len() < 2 && track.open.is_none() {
        out.push_str("\n</g>");
        return;
    }
    for pair in track.marks.windows(2) {
        let ((from, t0), (to, t1)) = (pair[0], pair[1]);
        let (x, w, fill) = (c(x_of(t0, s)), c(x_of(t1, s) - x_of(t0, s)), to.colour());
        let (from, to, t0, t1) = (from.label(), to.label(), duration(t0), duration(t1));
        let _ = write!(
            out,
            r#"
<rect x="{x}" y="{bar_y}" width="{w}" height="{BAR}" fill="{fill}"><title>{full}: {from} → {to}, {t0} → {t1}</title></rect>"#
        );
    }
    let (last, end) = (x_of(track.last(), s), x_of(track.end(), s));
    let total = match track.open {
        Some(watched) => {
            let (x, w, d) = (c(last), c(end - last), duration(watched));
            let _ = write!(
                out,
                r##"
<rect x="{x}" y="{bar_y}" width="{w}" height="{BAR}" fill="url(#unrecovered)" stroke="#999999" stroke-dasharray="3 2"><title>{full}: not recovered, watched for {d}</title></rect>"##
            );
            format!("not recovered after {watched:.0} s")
        }
        None => duration(track.last()),
    };
    for &(phase, t) in &track.marks {
        let (x, fill) = (c(x_of(t, s)), phase.colour());
        let _ = write!(
            out,
            r##"
<circle cx="{x}" cy="{cy}" r="3.5" fill="{fill}" stroke="#ffffff"/>"##
        );
    }
    let x = c(end + 8.0);
    let _ = write!(out, "\n<text x=\"{x}\" y=\"{y}\">{total}</text>\n</g>");
}

/// The same as text, one line per milestone of each lane, for a terminal.
pub fn text(lanes: &[Lane]) -> String {
    if lanes.is_empty() {
        return "no data\n".to_owned();
    }
    let mut out = String::new();
    for (i, lane) in lanes.iter().enumerate() {
        let track = lane.track();
        let mut prev = 0.0;
        let mut rows: Vec<(&str, f64, f64)> = Vec::new();
        for &(phase, t) in &track.marks {
            rows.push((phase.label(), t, t - prev));
            prev = t;
        }
        rows.extend(track.open.map(|w| ("not recovered", w, w - prev)));
        let longest = rows.iter().map(|r| r.2).fold(0.0, f64::max);
        let _ = writeln!(out, "{}{}", if i > 0 { "\n" } else { "" }, lane.name);
        for (j, (label, t, delta)) in rows.into_iter().enumerate() {
            let mut line = format!("{:>10}  {label:<24}", duration(t));
            if j > 0 {
                // Dividing first keeps the bar bounded for absurd times.
                let blocks = (delta / longest.max(f64::MIN_POSITIVE) * 30.0).round();
                let bar = "█".repeat(blocks.clamp(0.0, 30.0) as usize);
                let _ = write!(line, "  {:<8} {bar}", format!("+{}", duration(delta)));
            }
            let _ = writeln!(out, "{}", line.trim_end());
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use Phase::*;

    const FAST: &[Phase] = &[NotReady, Event, Tainted, Detached, PodsDeleted, Running];
    const RUNBOOK: &[Phase] = &[NotReady, Event, PodsDeleted, Running];

    fn lane(name: &str, phases: &[Phase], times: &[f64]) -> Lane {
        let marks = phases.iter().copied().zip(times.iter().copied()).collect();
        let name = name.to_owned();
        Lane {
            name,
            marks,
            watched_until: None,
        }
    }

    fn sample() -> Vec<Lane> {
        let mut alone = lane("left alone", &[NotReady], &[9.8]);
        alone.watched_until = Some(421.0);
        vec![
            lane(
                "node-fencer (binary)",
                FAST,
                &[9.8, 9.8, 9.9, 10.0, 23.9, 24.8],
            ),
            lane(
                "node-fencer (in-process)",
                FAST,
                &[9.8, 9.8, 9.87, 9.92, 15.7, 16.6],
            ),
            lane("force-delete runbook", RUNBOOK, &[9.8, 16.0, 16.1, 377.0]),
            alone,
        ]
    }

    /// The widths of the segments whose tooltip starts with `title`.
    fn widths(svg: &str, title: &str) -> Vec<f64> {
        let title = format!("<title>{title}");
        (svg.lines())
            .filter(|l| l.starts_with("<rect") && l.contains(&title))
            .filter_map(|l| l.split(" width=\"").nth(1)?.split('"').next()?.parse().ok())
            .collect()
    }

    fn assert_well_formed(svg: &str) {
        let root = "<svg xmlns=\"http://www.w3.org/2000/svg\"";
        assert!(svg.starts_with(root) && svg.ends_with("</svg>\n"), "{svg}");
        for tag in ["svg", "g", "text", "title"] {
            let opened = svg.matches(&format!("<{tag}>")).count();
            let opened = opened + svg.matches(&format!("<{tag} ")).count();
            assert_eq!(opened, svg.matches(&format!("</{tag}>")).count(), "<{tag}>");
        }
        assert!(!svg.contains("NaN") && !svg.contains("inf"), "{svg}");
    }

    #[test]
    fn the_picture_names_every_phase_and_lane() {
        let svg = svg("Seed scenario", &sample());
        assert_well_formed(&svg);
        for label in Phase::ALL.map(Phase::label) {
            assert!(svg.contains(&format!(">{label}</text>")), "{label}");
        }
        for Lane { name, .. } in sample() {
            assert!(svg.contains(&format!(">{name}</text>")), "{name}");
        }
        let tip = "(binary): Node NotReady → event sent, 9.8 s → 9.8 s</title>";
        assert!(svg.contains(tip) && svg.contains(">24.8 s</text>"));
        assert!(svg.contains(">377.0 s</text>") && svg.contains(">not recovered after 421 s<"));
        assert!(svg.contains("(axis compressed after 30 s)") && svg.contains(">Seed scenario<"));
        assert_eq!(svg, super::svg("Seed scenario", &sample()), "deterministic");
    }

    #[test]
    fn text_in_the_picture_is_escaped() {
        let svg = svg("a \"t\" <&>", &[lane("x <&> y", &[Running], &[1.0])]);
        assert_well_formed(&svg);
        assert!(svg.contains(">a &quot;t&quot; &lt;&amp;&gt;</text>"));
        assert!(svg.contains(">x &lt;&amp;&gt; y</text>") && !svg.contains("<&>"));
    }

    #[test]
    fn the_runbooks_wait_is_wider_than_the_fast_case_whole() {
        let svg = svg("t", &sample());
        let wait = widths(&svg, "force-delete runbook: pods deleted → replacements");
        let fast = widths(&svg, "node-fencer (binary):");
        assert_eq!((wait.len(), fast.len()), (1, 6), "{svg}");
        let whole: f64 = fast.iter().sum();
        assert!(whole > 100.0 && wait[0] > whole, "{wait:?} vs {whole}");
    }

    #[test]
    fn the_axis_is_monotonic_and_breaks_at_30_s() {
        let s = Scale::new(200.0, 600.0, 421.0);
        let x = |t: f64| x_of(t, &s);
        assert_eq!(s.brk, Some(BREAK));
        let xs: Vec<f64> = (0..=1000).map(|i| x(f64::from(i) * 0.5)).collect();
        assert!(xs.windows(2).all(|w| w[0] <= w[1]));
        assert!(xs.iter().all(|x| (200.0..=800.0).contains(x)));
        assert!((x(30.0) - (200.0 + 600.0 * BEFORE_BREAK)).abs() < 1e-9);
        assert!(x(30.0) < x(60.0) && x(60.0) < x(377.0) && x(377.0) < x(421.0));
        assert!((x(421.0) - 800.0).abs() < 1e-9 && (x(1e12) - 800.0).abs() < 1e-9);
        assert!((x(f64::NAN) - 200.0).abs() < 1e-9);
        let ticks = s.ticks();
        assert!(ticks.windows(2).all(|w| w[0] < w[1]), "{ticks:?}");
        assert!(
            ticks.starts_with(&[0.0, 5.0]) && ticks.contains(&30.0),
            "{ticks:?}"
        );
        assert!(ticks.iter().any(|t| *t > 300.0) && ticks.iter().all(|t| *t <= 421.0));
    }

    #[test]
    fn no_break_when_every_lane_ends_within_30_s() {
        let s = Scale::new(0.0, 500.0, 24.8);
        assert_eq!(s.brk, None);
        assert_eq!(s.ticks(), [0.0, 5.0, 10.0, 15.0, 20.0, 25.0]);
        assert!((x_of(12.5, &s) - 250.0).abs() < 1e-9, "linear to {}", s.end);
        let svg = svg("t", &sample()[..2]);
        assert_well_formed(&svg);
        assert!(!svg.contains("compressed") && !svg.contains("\"2 3\""));
    }

    #[test]
    fn bad_times_are_skipped_and_nothing_is_no_data() {
        let bad = [f64::NAN, -1.0, f64::INFINITY, -0.0];
        let mut odd = lane("odd", &[NotReady, Event, Running, Tainted], &bad);
        odd.watched_until = Some(f64::NAN);
        let lanes = [odd, lane("empty", &[], &[])];
        let svg = svg("t", &lanes);
        assert_well_formed(&svg);
        assert!(svg.contains(">odd</text>") && svg.contains(">empty</text>"));
        assert!(widths(&svg, "empty:").is_empty() && !svg.contains("not recovered"));
        let t = text(&lanes);
        let stop = "     0.0 s  instance stopped\n";
        assert!(
            t.starts_with(&format!("odd\n{stop}     0.0 s  taint applied")),
            "{t}"
        );
        assert!(t.ends_with(&format!("\n\nempty\n{stop}")), "{t}");
        let none = super::svg("Nothing <yet>", &[]);
        assert_well_formed(&none);
        assert!(none.contains(">Nothing &lt;yet&gt;<") && none.contains(">no data<"));
        assert_eq!(text(&[]), "no data\n");
        let huge = lane("huge", &[Running], &[f64::MAX]);
        assert_well_formed(&super::svg("t", &[huge]));
    }

    #[test]
    fn the_text_lists_milestones_in_time_order_with_their_deltas() {
        let phases = [Running, NotReady, PodsDeleted, Event];
        let mut shuffled = lane("binary", &phases, &[24.8, 0.276, 23.4, 9.9]);
        shuffled.watched_until = Some(99.0);
        let t = text(&[shuffled]);
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(lines[..2], ["binary", "     0.0 s  instance stopped"]);
        assert_eq!(lines[2], "    276 ms  Node NotReady             +276 ms  █");
        let deleted = format!("pods deleted              +13.5 s  {}", "█".repeat(30));
        assert!(lines[3].starts_with("     9.9 s  event sent                +9.6 s   █"));
        assert!(lines[4].starts_with("    23.4 s  ") && lines[4].ends_with(&deleted));
        assert!(lines[5].ends_with("replacements Running      +1.4 s   ███"));
        assert_eq!(lines.len(), 6, "a recovered lane's watch is not shown: {t}");
    }

    #[test]
    fn a_watched_lane_says_not_recovered() {
        let t = text(&sample()[2..]);
        let blocks: Vec<&str> = t.split("\n\n").collect();
        assert_eq!(blocks.len(), 2, "{t}");
        assert!(
            blocks[0].ends_with(&format!("+360.9 s {}", "█".repeat(30))),
            "{t}"
        );
        let end = "\n   421.0 s  not recovered             +411.2 s ";
        assert!(
            blocks[1].starts_with("left alone\n") && blocks[1].contains(end),
            "{t}"
        );
    }

    /// The picture in the docs is what `make bench` draws: if this module
    /// changes how it labels things, the benchmark has to run again.
    #[test]
    fn the_checked_in_picture_was_drawn_by_the_benchmark() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/recovery-timeline.svg");
        let svg = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{path}: {e}"));
        assert_well_formed(&svg);
        for label in Phase::ALL.map(Phase::label) {
            assert!(
                svg.contains(&format!(">{label}</text>")),
                "{path} lacks {label}"
            );
        }
        for lane in DOCS_LANES {
            assert!(
                svg.contains(&format!(">{lane}</text>")),
                "{path} lacks {lane}"
            );
        }
        assert!(svg.contains(">not recovered after "), "{path}");
    }
}
