#include "app/placement_model.h"

#include <QJsonArray>
#include <QJsonDocument>
#include <QJsonObject>
#include <QLocale>

namespace {

QString bytesText(qint64 bytes) { return QLocale::system().formattedDataSize(bytes, 1, QLocale::DataSizeTraditionalFormat); }

QString groupDetail(const QString& what, const TensorGroupInfo& g) {
  QString s = QStringLiteral("%1 · %2 · %3").arg(what, g.dtype, bytesText(g.bytes));
  if (!g.tensors.isEmpty()) s += QStringLiteral("\n") + g.tensors.join(QStringLiteral("\n"));
  return s;
}

PlacementCell weightCell(const QString& backend, const QString& what, const TensorGroupInfo& g) {
  PlacementCell c;
  c.backend = backend;
  c.precision = g.dtype.isEmpty() ? QStringLiteral("—") : g.dtype;
  c.precisions = {c.precision};
  c.precisionNote = QObject::tr("Weights run in the format the file stores (re-quantizing is not built yet)");
  c.detail = groupDetail(what, g);
  return c;
}

}  // namespace

// ---- PlacementPlan ------------------------------------------------------------

QString PlacementPlan::kvPrecision() const {
  QString p;
  for (int r = 1; r + 1 < rows.size(); ++r) {
    const QString& q = rows[r][kColAttnKv].precision;
    if (p.isEmpty()) p = q;
    else if (p != q) return {};
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

PlacementPlan PlacementPlan::allOn(const QString& backendId, const ModelSummary& m, const QString& kvDtype,
                                   const QStringList& kvChoices, const QString& kvNote) {
  PlacementPlan p;
  p.strategy = backendId == QLatin1String("cpu") ? QStringLiteral("cpu") : QStringLiteral("gpu");
  const int n = m.nLayer;
  p.rows.resize(n + 2);
  for (auto& row : p.rows) row.resize(kColCount);
  p.rows[0][0] = weightCell(backendId, QObject::tr("Token embedding"), m.embedding);
  p.rows[n + 1][0] = weightCell(backendId, QObject::tr("Output norm + LM head"), m.output);
  for (int l = 0; l < n; ++l) {
    auto& row = p.rows[l + 1];
    if (l < m.attnWeights.size()) row[kColAttnWeights] = weightCell(backendId, QObject::tr("Attention weights"), m.attnWeights[l]);
    if (l < m.ffnWeights.size()) row[kColFfnWeights] = weightCell(backendId, QObject::tr("FFN weights"), m.ffnWeights[l]);
    if (l < m.norms.size()) {
      row[kColNormRope] = weightCell(backendId, QObject::tr("Norms + RoPE"), m.norms[l]);
    }
    PlacementCell& kv = row[kColAttnKv];
    kv.backend = backendId;
    kv.precision = kvDtype;
    kv.precisions = kvChoices.isEmpty() ? QStringList{kvDtype} : kvChoices;
    kv.precisionNote = kvNote;
    kv.linkGroup = QStringLiteral("kv");
    kv.detail = QObject::tr("Attention + KV cache · %1 · %2 heads × %3 dims per token")
                    .arg(kvDtype)
                    .arg(m.nHeadKv)
                    .arg(m.headDim);
  }
  return p;
}

// ---- PlacementModel -----------------------------------------------------------

PlacementModel::PlacementModel(QObject* parent) : QAbstractTableModel(parent) {}

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

void PlacementModel::setStrategies(const QVector<StrategyInfo>& strategies) {
  m_strategies = strategies;
  emit pendingChanged();
}

void PlacementModel::setApplied(const PlacementPlan& plan) {
  const bool shape = plan.rows.size() != m_applied.rows.size();
  if (shape) beginResetModel();
  m_applied = plan;
  m_pending = plan;
  if (shape) {
    endResetModel();
  } else {
    cellsChanged();
  }
  emit pendingChanged();
}

void PlacementModel::revertPending() {
  m_pending = m_applied;
  cellsChanged();
  emit pendingChanged();
}

bool PlacementModel::setCellBackend(int row, int column, const QString& backendId) {
  if (row < 0 || row >= m_pending.rows.size() || column < 0 || column >= kColCount) return false;
  if (m_pending.isEdgeRow(row) && column != 0) return false;
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

bool PlacementModel::setCellPrecision(int row, int column, const QString& precision) {
  if (row < 0 || row >= m_pending.rows.size() || column < 0 || column >= kColCount) return false;
  PlacementCell& cell = m_pending.rows[row][column];
  if (!cell.precisions.contains(precision)) return false;
  if (cell.linkGroup.isEmpty()) {
    cell.precision = precision;
  } else {
    // Linked cells (the KV cache: one precision for the whole model today) change together.
    const QString group = cell.linkGroup;
    for (auto& r : m_pending.rows) {
      for (auto& c : r) {
        if (c.linkGroup == group) c.precision = precision;
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

void PlacementModel::cellsChanged() {
  if (rowCount() > 0) emit dataChanged(index(0, 0), index(rowCount() - 1, kColCount - 1));
}

int PlacementModel::rowCount(const QModelIndex& parent) const { return parent.isValid() ? 0 : m_pending.rows.size(); }

int PlacementModel::columnCount(const QModelIndex& parent) const { return parent.isValid() ? 0 : kColCount; }

QString PlacementModel::columnTitle(int column) {
  switch (column) {
    case kColAttnWeights: return tr("Attn weights");
    case kColAttnKv: return tr("Attn + KV");
    case kColFfnWeights: return tr("FFN weights");
    case kColNormRope: return tr("Norms / RoPE");
    default: return {};
  }
}

QString PlacementModel::rowTitle(int row) const {
  if (row == 0) return tr("Embedding");
  if (row == m_pending.rows.size() - 1) return tr("Output");
  return tr("Layer %1").arg(row - 1);
}

QVariant PlacementModel::headerData(int section, Qt::Orientation orientation, int role) const {
  if (role != Qt::DisplayRole) return {};
  return orientation == Qt::Horizontal ? QVariant(columnTitle(section)) : QVariant(rowTitle(section));
}

Qt::ItemFlags PlacementModel::flags(const QModelIndex& index) const {
  if (!index.isValid()) return Qt::NoItemFlags;
  if (m_pending.isEdgeRow(index.row()) && index.column() != 0) return Qt::NoItemFlags;
  return Qt::ItemIsEnabled | Qt::ItemIsSelectable;
}

QVariant PlacementModel::data(const QModelIndex& index, int role) const {
  if (!index.isValid() || index.row() >= m_pending.rows.size()) return {};
  const int r = index.row(), c = index.column();
  if (m_pending.isEdgeRow(r) && c != 0) return {};
  const PlacementCell& cell = m_pending.rows[r][c];
  const BackendInfo* b = backend(cell.backend);
  const QString label = b ? b->label : cell.backend.toUpper();
  const bool dirty = r < m_applied.rows.size() && !(m_applied.rows[r][c] == cell);
  switch (role) {
    case Qt::DisplayRole: return cell.precision;
    case Qt::ToolTipRole: {
      QString tip = QStringLiteral("%1 — %2\n%3").arg(rowTitle(r), label, cell.detail);
      if (dirty) {
        const PlacementCell& was = m_applied.rows[r][c];
        const BackendInfo* wb = backend(was.backend);
        tip += tr("\n\nPending: was %1 · %2 (press Apply)").arg(wb ? wb->label : was.backend, was.precision);
      }
      return tip;
    }
    case BackendIdRole: return cell.backend;
    case BackendLabelRole: return label;
    case BackendColorRole: return b ? b->color : QColor(Qt::gray);
    case DirtyRole: return dirty;
    case EdgeRowRole: return m_pending.isEdgeRow(r);
    default: return {};
  }
}
