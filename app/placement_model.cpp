#include "app/placement_model.h"

#include <QJsonArray>
#include <QJsonDocument>
#include <QJsonObject>
#include <QLocale>
#include <algorithm>
#include <cmath>

namespace {

QString bytesText(qint64 bytes) {
  return QLocale::system().formattedDataSize(bytes, 1, QLocale::DataSizeTraditionalFormat);
}

QString groupDetail(const QString& what, const TensorGroupInfo& g) {
  QString s = QStringLiteral("%1 · %2 · %3").arg(what, g.dtype, bytesText(g.bytes));
  if (!g.tensors.isEmpty()) s += QStringLiteral("\n") + g.tensors.join(QStringLiteral("\n"));
  return s;
}

PlacementCell weightCell(const QString& backend, const QString& what, const TensorGroupInfo& g) {
  PlacementCell c;
  c.backend = backend;
  c.fileDtype = g.dtype.isEmpty() ? QStringLiteral("—") : g.dtype;
  c.precision = c.fileDtype;
  c.precisions = {kKeepPrecision};
  c.precisionNote = QObject::tr("Weights run in the format the file stores");
  c.detail = groupDetail(what, g);
  return c;
}

}  // namespace

// ---- PlacementPlan ------------------------------------------------------------

QString PlacementPlan::kvPrecision() const {
  QString p;
  for (int r = 1; r + 1 < rows.size(); ++r) {
    const QString& q = rows[r][kColAttnKv].precision;
    if (p.isEmpty())
      p = q;
    else if (p != q)
      return {};
  }
  return p;
}

QStringList PlacementPlan::backendsUsed() const {
  QStringList ids;
  for (int r = 0; r < rows.size(); ++r) {
    for (int c = 0; c < rows[r].size(); ++c) {
      if (isEdgeRow(r) && c > 0) continue;
      if (!ids.contains(rows[r][c].backend)) ids << rows[r][c].backend;
    }
  }
  return ids;
}

QString PlacementPlan::toJson() const {
  QJsonObject o;
  o[QStringLiteral("strategy")] = strategy;
  o[QStringLiteral("gpu_layers")] = gpuLayers;
  o[QStringLiteral("vram_budget_mib")] = vramBudgetMiB;
  QJsonArray rowsJson;
  for (int r = 0; r < rows.size(); ++r) {
    QJsonArray cells;
    for (int c = 0; c < (isEdgeRow(r) ? 1 : rows[r].size()); ++c) {
      cells.append(QJsonObject{{QStringLiteral("backend"), rows[r][c].backend},
                               {QStringLiteral("precision"), rows[r][c].precision}});
    }
    rowsJson.append(cells);
  }
  o[QStringLiteral("rows")] = rowsJson;
  return QString::fromUtf8(QJsonDocument(o).toJson(QJsonDocument::Compact));
}

PlacementPlan PlacementPlan::allOn(const QString& backendId, const ModelSummary& m,
                                   const QString& kvDtype, const QStringList& kvChoices,
                                   const QString& kvNote) {
  PlacementPlan p;
  p.strategy = backendId == QLatin1String("cpu") ? QStringLiteral("cpu") : QStringLiteral("gpu");
  p.nCtx = m.nCtx;
  const int n = m.nLayer;
  p.rows.resize(n + 2);
  for (auto& row : p.rows) row.resize(kColCount);
  p.rows[0][0] = weightCell(backendId, QObject::tr("Token embedding"), m.embedding);
  p.rows[n + 1][0] = weightCell(backendId, QObject::tr("Output norm + LM head"), m.output);
  for (int l = 0; l < n; ++l) {
    auto& row = p.rows[l + 1];
    if (l < m.attnWeights.size())
      row[kColAttnWeights] =
          weightCell(backendId, QObject::tr("Attention weights"), m.attnWeights[l]);
    if (l < m.ffnWeights.size())
      row[kColFfnWeights] = weightCell(backendId, QObject::tr("FFN weights"), m.ffnWeights[l]);
    if (l < m.norms.size()) {
      row[kColNormRope] = weightCell(backendId, QObject::tr("Norms + RoPE"), m.norms[l]);
      row[kColNormRope].precisions.clear();
      row[kColNormRope].precisionNote = QObject::tr("Norm weights are vectors: they stay F32");
    }
    PlacementCell& kv = row[kColAttnKv];
    kv.backend = backendId;
    kv.precision = kvDtype;
    kv.dtype = kvDtype;
    kv.precisions = kvChoices.isEmpty() ? QStringList{kvDtype} : kvChoices;
    kv.precisionNote = kvNote;
    kv.linkGroup = QStringLiteral("kv");
    kv.detail = QObject::tr("Attention + KV cache · %1 heads × %2 dims per token")
                    .arg(m.nHeadKv)
                    .arg(m.headDim);
  }
  return p;
}

// ---- PlacementModel -----------------------------------------------------------

PlacementModel::PlacementModel(QObject* parent) : QAbstractTableModel(parent) {
  // A check is of one placement: another one clears it.
  connect(this, &PlacementModel::pendingChanged, this, [this] {
    if (!m_check.rows.isEmpty() && m_check.rows != m_pending.rows) {
      m_check = PrecisionCheck();
      checkColumnsChanged();
    }
  });
}

void PlacementModel::setBackends(const QVector<BackendInfo>& backends) {
  m_backends = backends;
  cellsChanged();
}

const BackendInfo* PlacementModel::backend(const QString& id) const {
  for (const BackendInfo& b : m_backends) {
    if (b.id == id) return &b;
  }
  return nullptr;
}

const BackendInfo* PlacementModel::gpuBackend() const {
  for (const BackendInfo& b : m_backends) {
    if (b.available && b.id != QLatin1String("cpu")) return &b;
  }
  return nullptr;
}

void PlacementModel::setStrategies(const QVector<StrategyInfo>& strategies) {
  m_strategies = strategies;
  emit pendingChanged();
}

void PlacementModel::setApplied(const PlacementPlan& plan) {
  const bool shape = plan.rows.size() != m_applied.rows.size();
  if (shape) {
    beginResetModel();
    m_measured = {};
    m_estimate = {};
  }
  // Which cells changed unit: shown as moving for a moment.
  m_moved.clear();
  m_movedAt.invalidate();
  if (!shape) {
    bool any = false;
    m_moved.resize(plan.rows.size());
    for (int r = 0; r < plan.rows.size(); ++r) {
      m_moved[r].resize(plan.rows[r].size());
      for (int c = 0; c < plan.rows[r].size() && c < m_applied.rows[r].size(); ++c) {
        m_moved[r][c] = plan.rows[r][c].backend != m_applied.rows[r][c].backend;
        any |= m_moved[r][c];
      }
    }
    if (any) m_movedAt.start();
  }
  m_applied = plan;
  m_pending = plan;
  if (shape) {
    endResetModel();
  } else {
    cellsChanged();
  }
  emit pendingChanged();
}

bool PlacementModel::moving() const {
  return m_movedAt.isValid() && m_movedAt.elapsed() < kMoveFadeMs;
}

void PlacementModel::revertPending() {
  m_pending = m_applied;
  cellsChanged();
  emit pendingChanged();
}

bool PlacementModel::setPending(const PlacementPlan& plan) {
  if (plan.rows.size() != m_pending.rows.size()) return false;
  m_pending = plan;
  cellsChanged();
  emit pendingChanged();
  return true;
}

bool PlacementModel::validCell(int row, int column) const {
  if (row < 0 || row >= m_pending.rows.size() || column < 0 || column >= kColCount) return false;
  return !(m_pending.isEdgeRow(row) && column != 0);
}

bool PlacementModel::setCellBackend(int row, int column, const QString& backendId) {
  if (!validCell(row, column)) return false;
  const BackendInfo* b = backend(backendId);
  if (!b || !b->available) return false;
  PlacementCell& c = m_pending.rows[row][column];
  if (c.backend == backendId) return true;
  c.backend = backendId;
  m_pending.strategy = QStringLiteral("custom");
  const QModelIndex i = index(row, column);
  emit dataChanged(i, i);
  emit pendingChanged();
  return true;
}

bool PlacementModel::cycleCellBackend(int row, int column) {
  if (!validCell(row, column)) return false;
  QStringList ids;
  for (const BackendInfo& b : m_backends) {
    if (b.available) ids << b.id;
  }
  if (ids.size() < 2) return false;
  const qsizetype at = ids.indexOf(m_pending.rows[row][column].backend);
  return setCellBackend(row, column, ids[(at + 1) % ids.size()]);
}

bool PlacementModel::setCellPrecision(int row, int column, const QString& precision) {
  if (!validCell(row, column)) return false;
  PlacementCell& cell = m_pending.rows[row][column];
  if (!cell.precisions.contains(precision)) return false;
  auto set = [&precision](PlacementCell& c) {
    if (precision == kKeepPrecision || (!c.fileDtype.isEmpty() && precision == c.fileDtype)) {
      c.dtype.clear();
      c.precision = c.fileDtype;
    } else {
      c.dtype = precision;
      c.precision = precision;
    }
  };
  if (cell.linkGroup.isEmpty()) {
    set(cell);
  } else {
    // Linked cells (the KV cache: one precision for the whole model) change together.
    const QString group = cell.linkGroup;
    for (auto& r : m_pending.rows) {
      for (auto& c : r) {
        if (c.linkGroup == group) set(c);
      }
    }
  }
  m_pending.strategy = QStringLiteral("custom");
  cellsChanged();
  emit pendingChanged();
  return true;
}

void PlacementModel::setPendingStrategy(const QString& strategy, int gpuLayers, int vramBudgetMiB,
                                        const PlacementPlan* planned) {
  if (planned && planned->rows.size() == m_pending.rows.size()) m_pending.rows = planned->rows;
  m_pending.strategy = strategy;
  m_pending.gpuLayers = gpuLayers;
  m_pending.vramBudgetMiB = vramBudgetMiB;
  cellsChanged();
  emit pendingChanged();
}

void PlacementModel::setEstimate(const PlanEstimate& e) {
  m_estimate = e;
  timingColumnChanged();
}

void PlacementModel::setMeasured(const MeasuredTimes& m) {
  m_measured = m;
  timingColumnChanged();
}

void PlacementModel::setPrecisionCheck(const PrecisionCheck& c) {
  m_check = c;
  checkColumnsChanged();
}

void PlacementModel::setKvLayers(const std::vector<KvLayerBytes>& layers) {
  if (layers == m_kvLayers) return;
  m_kvLayers = layers;
  if (rowCount() > 0) emit dataChanged(index(0, kColKvTiers), index(rowCount() - 1, kColKvTiers));
}

QVariant PlacementModel::kvTiersData(int row, int role) const {
  // Layer rows only (row l + 1 is layer l); the embedding and output have no KV.
  const int l = row - 1;
  if (m_pending.isEdgeRow(row) || l < 0 || l >= static_cast<int>(m_kvLayers.size())) return {};
  const KvLayerBytes& b = m_kvLayers[static_cast<size_t>(l)];
  const uint64_t all = b.gpu + b.ram + b.ssd;
  const std::pair<const char*, uint64_t> tiers[] = {
      {QT_TR_NOOP("GPU"), b.gpu}, {QT_TR_NOOP("RAM"), b.ram}, {QT_TR_NOOP("SSD"), b.ssd}};
  if (role == Qt::DisplayRole) {
    if (all == 0) return QStringLiteral("—");
    QStringList parts;  // "GPU 62% RAM 38%": the tiers that hold any of it
    for (const auto& [name, bytes] : tiers) {
      if (bytes == 0) continue;
      parts << QStringLiteral("%1 %2%").arg(tr(name)).arg(static_cast<int>(
          std::lround(100.0 * static_cast<double>(bytes) / static_cast<double>(all))));
    }
    return parts.join(QLatin1Char(' '));
  }
  if (role == Qt::ToolTipRole) {
    if (all == 0) return tr("%1: no KV yet").arg(rowTitle(row));
    QString tip = tr("%1's KV cache now").arg(rowTitle(row));
    for (const auto& [name, bytes] : tiers)
      tip += QStringLiteral("\n%1: %2")
                 .arg(tr(name),
                      QLocale::system().formattedDataSize(static_cast<qint64>(bytes), 1,
                                                          QLocale::DataSizeTraditionalFormat));
    return tip;
  }
  return {};
}

bool PlacementModel::hasPrecisionCheck() const {
  return !m_check.rows.isEmpty() && m_check.rows == m_pending.rows;
}

void PlacementModel::checkColumnsChanged() {
  if (rowCount() > 0) emit dataChanged(index(0, kColError), index(rowCount() - 1, kColOutliers));
}

void PlacementModel::cellsChanged() {
  if (rowCount() > 0) emit dataChanged(index(0, 0), index(rowCount() - 1, columnCount() - 1));
}

void PlacementModel::timingColumnChanged() {
  if (rowCount() > 0) emit dataChanged(index(0, kColTiming), index(rowCount() - 1, kColTiming));
  emit timingChanged();
}

int PlacementModel::rowCount(const QModelIndex& parent) const {
  return parent.isValid() ? 0 : m_pending.rows.size();
}

int PlacementModel::columnCount(const QModelIndex& parent) const {
  return parent.isValid() ? 0 : kColAll;
}

QString PlacementModel::columnTitle(int column) {
  switch (column) {
    case kColAttnWeights: return tr("attn_w");
    case kColAttnKv: return tr("attn + KV");
    case kColFfnWeights: return tr("ffn");
    case kColNormRope: return tr("norm");
    case kColTiming: return tr("ms: ≈ pred\nP50 / P99");
    case kColKvTiers: return tr("KV on");
    case kColError: return tr("error");
    case kColOutliers: return tr("outliers");
    default: return {};
  }
}

QString PlacementModel::rowTitle(int row) const {
  if (row == 0) return tr("Embedding");
  if (row == m_pending.rows.size() - 1) return tr("Output");
  return tr("Layer %1").arg(row - 1);
}

QString PlacementModel::precisionLabel(const PlacementCell& cell, const QString& choice) {
  if (choice == kKeepPrecision) return tr("As the file stores it (%1)").arg(cell.fileDtype);
  return choice;
}

QVariant PlacementModel::headerData(int section, Qt::Orientation orientation, int role) const {
  if (role == Qt::ToolTipRole && orientation == Qt::Horizontal) {
    switch (section) {
      case kColAttnWeights: return tr("Attention weights: the q, k, v and o projections");
      case kColAttnKv:
        return tr("Attention compute and the layer's KV cache (the cache lives on this unit)");
      case kColFfnWeights: return tr("FFN: gate, up and down projections");
      case kColNormRope: return tr("RMS norms, RoPE and residual adds");
      case kColTiming:
        return tr(
            "Predicted time of the row (cost model, pending placement), then the measured P50 / "
            "P99 of "
            "decode steps (profiler, applied placement)");
      case kColError:
        return tr(
            "Relative error of the layer's output as placed against a double-precision "
            "reference on the same input (Check precision)");
      case kColOutliers:
        return tr(
            "Share of the layer's matmul inputs (after the norms) farther than 6 standard "
            "deviations from their mean: layers with many tolerate low precision least (Check "
            "precision)");
      default: return {};
    }
  }
  if (role != Qt::DisplayRole) return {};
  return orientation == Qt::Horizontal ? QVariant(columnTitle(section))
                                       : QVariant(rowTitle(section));
}

Qt::ItemFlags PlacementModel::flags(const QModelIndex& index) const {
  if (!index.isValid()) return Qt::NoItemFlags;
  if (index.column() >= kColTiming) return Qt::ItemIsEnabled;
  if (m_pending.isEdgeRow(index.row()) && index.column() != 0) return Qt::NoItemFlags;
  return Qt::ItemIsEnabled | Qt::ItemIsSelectable;
}

QVariant PlacementModel::data(const QModelIndex& index, int role) const {
  if (!index.isValid() || index.row() >= m_pending.rows.size()) return {};
  const int r = index.row(), c = index.column();
  if (c == kColTiming) {
    auto at = [r](const QVector<double>& v) -> QVariant {
      return r < v.size() && v[r] > 0 ? QVariant(v[r]) : QVariant();
    };
    switch (role) {
      case PredictedMsRole: return m_estimate.valid ? at(m_estimate.rowMs) : QVariant();
      case P50MsRole: return at(m_measured.p50Ms);
      case P99MsRole: return at(m_measured.p99Ms);
      case Qt::ToolTipRole: {
        const QVariant pred = m_estimate.valid ? at(m_estimate.rowMs) : QVariant();
        const QVariant p50 = at(m_measured.p50Ms), p99 = at(m_measured.p99Ms);
        QString tip =
            tr("%1\nPredicted: %2")
                .arg(rowTitle(r),
                     pred.isValid() ? tr("%1 ms").arg(pred.toDouble(), 0, 'f', 3) : tr("—"));
        tip += tr("\nMeasured: %1")
                   .arg(p50.isValid()
                            ? tr("P50 %1 ms, P99 %2 ms over %3 steps")
                                  .arg(p50.toDouble(), 0, 'f', 3)
                                  .arg(p99.toDouble(), 0, 'f', 3)
                                  .arg(r < m_measured.counts.size() ? m_measured.counts[r] : 0)
                            : tr("no decode step yet"));
        return tip;
      }
      default: return {};
    }
  }
  if (c == kColKvTiers) return kvTiersData(r, role);
  if (c == kColError || c == kColOutliers) {
    const bool ok = hasPrecisionCheck();
    auto at = [&](const QVector<double>& v) { return ok && r < v.size() ? v[r] : -1.0; };
    const double e = at(m_check.error), o = at(m_check.outliers), oo = at(m_check.outliersOut);
    if (role == Qt::DisplayRole) {
      const double v = c == kColError ? e : o;
      if (v < 0) return QStringLiteral("—");
      return c == kColError ? QString::number(v, 'e', 1)
                            : QStringLiteral("%1%").arg(100.0 * v, 0, 'f', 2);
    }
    if (role == Qt::ToolTipRole) {
      if (!ok) return tr("%1: not checked (Check precision)").arg(rowTitle(r));
      QString tip = tr("%1, %2 tokens").arg(rowTitle(r)).arg(m_check.nTokens);
      if (e >= 0) tip += tr("\nRelative error as placed: %1").arg(e, 0, 'e', 2);
      if (o >= 0) tip += tr("\nOutliers in the matmul inputs: %1%").arg(100.0 * o, 0, 'f', 3);
      if (oo >= 0) tip += tr("\nOutliers in the output: %1%").arg(100.0 * oo, 0, 'f', 3);
      return tip;
    }
    return {};
  }
  if (m_pending.isEdgeRow(r) && c != 0) return {};
  const PlacementCell& cell = m_pending.rows[r][c];
  const BackendInfo* b = backend(cell.backend);
  const QString label = b ? b->label : cell.backend.toUpper();
  const bool dirty = r < m_applied.rows.size() && !(m_applied.rows[r][c] == cell);
  switch (role) {
    case Qt::DisplayRole: {
      // A mixture ("Q4_K + Q6_K") shows its largest part and a "+"; the tooltip has it all.
      const QString main = cell.precision.section(QStringLiteral(" + "), 0, 0);
      return QStringLiteral("%1 %2%3").arg(
          label, main, main == cell.precision ? QString() : QStringLiteral("+"));
    }
    case PrecisionRole: return cell.precision;
    case Qt::ToolTipRole: {
      QString tip = QStringLiteral("%1 · %2 — %3 %4\n%5")
                        .arg(rowTitle(r), m_pending.isEdgeRow(r) ? tr("weights") : columnTitle(c),
                             label, cell.precision, cell.detail);
      if (!cell.dtype.isEmpty() && cell.dtype != cell.fileDtype && !cell.fileDtype.isEmpty()) {
        tip += tr("\nRe-quantized from %1 when applied").arg(cell.fileDtype);
      }
      if (dirty) {
        const PlacementCell& was = m_applied.rows[r][c];
        const BackendInfo* wb = backend(was.backend);
        tip += tr("\n\nPending: was %1 %2 (press Apply)")
                   .arg(wb ? wb->label : was.backend, was.precision);
      }
      return tip;
    }
    case BackendIdRole: return cell.backend;
    case BackendLabelRole: return label;
    case BackendColorRole: return b ? b->color : QColor(Qt::gray);
    case DirtyRole: return dirty;
    case MovedRole: {
      if (!m_movedAt.isValid() || r >= m_moved.size() || c >= m_moved[r].size() || !m_moved[r][c])
        return 0.0;
      return std::max(0.0, 1.0 - static_cast<double>(m_movedAt.elapsed()) / kMoveFadeMs);
    }
    case EdgeRowRole: return m_pending.isEdgeRow(r);
    default: return {};
  }
}
