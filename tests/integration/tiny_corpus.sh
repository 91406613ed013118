# Sourced by the integration scripts: write_tiny_corpus DIR [DOCS] writes a deterministic
# plain-text corpus of DOCS documents (default 30, 12 sentences each) into DIR;
# tiny_bert_tables are the config tables they share. (fail and the work directory are
# common.sh's.)
write_tiny_corpus() {
  local dir=$1 docs=${2:-30} d s w line
  local words=(the river ran past old mill where children played every summer and sang songs about green hills far
    away from town Mary went to Boston in 1961 with John)
  mkdir -p "$dir"
  for d in $(seq -w 0 $((docs - 1))); do
    for s in $(seq 1 12); do
      line=""
      for w in $(seq 1 $((5 + (10#$d * 7 + s * 3) % 9))); do line+="${words[$(( (10#$d * 31 + s * 17 + w * 13) % ${#words[@]} ))]} "; done
      echo "${line% }." >> "$dir/doc$d.txt"
    done
  done
}

# tiny_model_table prints the [model] table of a 2-layer, 32-wide BERT; tiny_bert_tables
# WORK adds [data.prepare] for the corpus in WORK/corpus (shards in WORK/data). For config
# heredocs.
tiny_model_table() {
  cat <<TOML
[model]
size = "custom"
num_layers = 2
hidden_size = 32
num_heads = 2
max_position_embeddings = 64
TOML
}
tiny_bert_tables() {
  tiny_model_table
  cat <<TOML

[data.prepare]
corpus = "$1/corpus"
out_dir = "$1/data"
vocab_size = 150
seq_length = 64
holdout_docs = 3
TOML
}

# tiny_pretrain_toml DIR [KEYS]: the launch tests' pre-training run (4 steps of 8 sequences
# in micro-batches of 2, AdamW) over DIR/corpus, with the top-level lines KEYS; callers
# append their own tables.
tiny_pretrain_toml() {
  cat <<TOML
train_batch_size = 8
train_micro_batch_size_per_gpu = 2
train_steps = 4
steps_per_print = 1
${2:-}

$(tiny_bert_tables "$1")

[optimizer]
type = "AdamW"
params = { lr = 2e-3, weight_decay = 0.01 }
TOML
}

# tiny_squad_tables DIR: the tiny model with a SQuAD head on 2 stages, fine-tuned with Adam on
# DIR/qa (dsactor prep qa-from-corpus) with DIR/data's vocabulary; callers put the batch,
# steps and init_checkpoint before it.
tiny_squad_tables() {
  tiny_model_table
  cat <<TOML
head = "squad"

[optimizer]
type = "Adam"
params = { lr = 3e-5 }

[pipeline]
stages = 2

[data]
vocab = "$1/data/vocab.txt"
train_file = "$1/qa/train.json"
dev_file = "$1/qa/dev.json"
max_seq_length = 64
doc_stride = 32
max_query_length = 16
TOML
}
