//! A small progress bar on stderr: steps are weighted by their planned
//! seconds so the percentage and the time left track wall-clock time.
//! On a terminal it redraws one line; otherwise it prints one line per step.

use std::io::{IsTerminal, Write};
use std::sync::Mutex;
use std::time::{Duration, Instant};

const WIDTH: usize = 30;
const REDRAW_EVERY: Duration = Duration::from_millis(250);

struct State {
    done: f64,
    current_weight: f64,
    step_started: Instant,
    label: String,
    last_draw: Option<Instant>,
}

/// Progress over a run whose steps have planned durations.
pub struct Progress {
    total: f64,
    started: Instant,
    tty: bool,
    state: Mutex<State>,
}

impl Progress {
    /// A bar for steps that add up to `total_planned` seconds.
    pub fn new(total_planned: f64) -> Progress {
        Progress {
            total: total_planned.max(1.0),
            started: Instant::now(),
            tty: std::io::stderr().is_terminal(),
            state: Mutex::new(State {
                done: 0.0,
                current_weight: 0.0,
                step_started: Instant::now(),
                label: String::new(),
                last_draw: None,
            }),
        }
    }

    /// Starts a step of `planned` seconds; the previous step counts as done.
    pub fn step(&self, label: &str, planned: f64) {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        state.done += state.current_weight;
        state.current_weight = planned;
        state.step_started = Instant::now();
        state.label = label.to_owned();
        state.last_draw = None;
        if self.tty {
            self.draw(&mut state);
        } else {
            let elapsed = self.started.elapsed().as_secs();
            eprintln!(
                "[{:>3.0}% {:>2}:{:02}] {label}",
                100.0 * state.done / self.total,
                elapsed / 60,
                elapsed % 60
            );
        }
    }

    /// Redraws the bar (at most every 250 ms) while a step runs.
    pub fn tick(&self) {
        if !self.tty {
            return;
        }
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if state.last_draw.is_some_and(|t| t.elapsed() < REDRAW_EVERY) {
            return;
        }
        self.draw(&mut state);
    }

    /// Prints a line above the bar.
    pub fn println(&self, line: &str) {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if self.tty {
            eprint!("\r\x1b[2K");
            eprintln!("{line}");
            self.draw(&mut state);
        } else {
            eprintln!("{line}");
        }
    }

    /// Ends the bar with a final line.
    pub fn finish(&self) {
        let elapsed = self.started.elapsed().as_secs();
        if self.tty {
            eprint!("\r\x1b[2K");
        }
        eprintln!("done in {}:{:02}", elapsed / 60, elapsed % 60);
    }

    fn draw(&self, state: &mut State) {
        let in_step = state
            .step_started
            .elapsed()
            .as_secs_f64()
            .min(state.current_weight);
        let fraction = ((state.done + in_step) / self.total).clamp(0.0, 1.0);
        let filled = (fraction * WIDTH as f64).round() as usize;
        let elapsed = self.started.elapsed().as_secs_f64();
        let left = if fraction > 0.02 {
            (elapsed / fraction - elapsed).max(0.0) as u64
        } else {
            (self.total - elapsed).max(0.0) as u64
        };
        let mut err = std::io::stderr().lock();
        let _ = write!(
            err,
            "\r\x1b[2K[{}{}] {:>3.0}%  ~{}:{:02} left  {}",
            "#".repeat(filled),
            "-".repeat(WIDTH - filled),
            fraction * 100.0,
            left / 60,
            left % 60,
            state.label
        );
        let _ = err.flush();
        state.last_draw = Some(Instant::now());
    }
}
