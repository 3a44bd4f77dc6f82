// Tokens per second over time, drawn with uPlot.

import { useEffect, useRef } from 'preact/hooks';
import uPlot from 'uplot';
import 'uplot/dist/uPlot.min.css';
import type { TokPoint } from '../live';

function cssVar(el: Element, name: string, fallback: string): string {
  const v = getComputedStyle(el).getPropertyValue(name).trim();
  return v || fallback;
}

function canDraw(): boolean {
  try {
    return !!document.createElement('canvas').getContext('2d');
  } catch {
    return false;
  }
}

/** The widths of history the chart can show, in seconds; it takes the narrowest that holds the data. */
export const CHART_WINDOWS_S = [10, 30, 60, 120];
const WIDEST = CHART_WINDOWS_S[CHART_WINDOWS_S.length - 1]!;

/** The chart's data: x is seconds relative to the newest point (≤ 0), y is tok/s; and the window shown. */
export function chartData(series: TokPoint[]): { data: [number[], number[]]; windowS: number } {
  const last = series[series.length - 1];
  if (!last) return { data: [[], []], windowS: CHART_WINDOWS_S[0]! };
  const shown = series.filter((p) => p.t >= last.t - WIDEST);
  const span = last.t - shown[0]!.t;
  const windowS = CHART_WINDOWS_S.find((w) => span <= w) ?? WIDEST;
  return { data: [shown.map((p) => p.t - last.t), shown.map((p) => p.tokS)], windowS };
}

export function TokChart({ series, height = 120 }: { series: TokPoint[]; height?: number }) {
  const box = useRef<HTMLDivElement>(null);
  const plot = useRef<uPlot | null>(null);
  const windowS = useRef(CHART_WINDOWS_S[0]!);

  useEffect(() => {
    const el = box.current;
    if (!el || !canDraw()) return;
    const line = cssVar(el, '--accent', '#6b8afd');
    const fill = cssVar(el, '--accent-soft', 'rgba(107,138,253,0.15)');
    const grid = cssVar(el, '--chart-grid', 'rgba(128,128,128,0.15)');
    const text = cssVar(el, '--text-dim', '#888');
    const font = '10px system-ui, sans-serif';
    const opts: uPlot.Options = {
      width: Math.max(el.clientWidth, 200),
      height,
      legend: { show: false },
      cursor: { drag: { x: false, y: false }, points: { size: 6 } },
      scales: {
        x: { time: false, range: () => [-windowS.current, 0] },
        y: { range: (_u, _min, max) => [0, Math.max(10, Math.ceil(((max || 0) * 1.15) / 10) * 10)] },
      },
      axes: [
        {
          stroke: text,
          grid: { stroke: grid, width: 1 },
          ticks: { show: false },
          size: 22,
          font,
          splits: () => [4, 3, 2, 1, 0].map((i) => (-windowS.current * i) / 4),
          values: (_u, splits) => splits.map((v) => (v === 0 ? 'now' : `${Math.round(v * 10) / 10}s`)),
        },
        { stroke: text, grid: { stroke: grid, width: 1 }, ticks: { show: false }, size: 34, font },
      ],
      // Dots while there are few points, so that a short reply still shows.
      series: [
        {},
        { label: 'tok/s', stroke: line, width: 2, fill, points: { show: (_u, _s, i0, i1) => i1 - i0 < 24, size: 5, fill: line } },
      ],
    };
    const u = new uPlot(opts, chartData([]).data, el);
    plot.current = u;
    const resize = new ResizeObserver(() => {
      if (el.clientWidth > 0) u.setSize({ width: el.clientWidth, height });
    });
    resize.observe(el);
    return () => {
      resize.disconnect();
      u.destroy();
      plot.current = null;
    };
  }, [height]);

  useEffect(() => {
    const { data, windowS: w } = chartData(series);
    windowS.current = w;
    plot.current?.setData(data);
  }, [series]);

  return <div class="tok-chart" ref={box} data-testid="panel-chart" />;
}
