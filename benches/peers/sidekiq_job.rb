# Sidekiq side of the Redis comparison (docs/performance.md): the job, loaded by the worker
# process that benches/peers/sidekiq.sh starts. NoopJob does nothing; WriteJob makes one
# unfenced HINCRBY.
require "sidekiq"

class NoopJob
  include Sidekiq::Worker
  sidekiq_options retry: false

  def perform; end
end

class WriteJob
  include Sidekiq::Worker
  sidekiq_options retry: false

  def perform
    Sidekiq.redis { |r| r.hincrby("bench:n", "n", 1) }
  end
end
